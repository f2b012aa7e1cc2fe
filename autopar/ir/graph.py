"""A plain-data copy of the joint graph, so a Plan is self-contained JSON.

Backends emit programs from this IR; nothing downstream of planning needs the
fx graph or torch's tracing machinery.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from autopar.ir.outputs import OutputTree
from autopar.ir.program import STEP, Program, TensorMeta, forward_nodes, forward_outputs, shape_table


@dataclass(frozen=True)
class IRNode:
    name: str
    op: str  # placeholder | constant | call | output
    target: str  # "aten.addmm.default", "getitem", or "" for placeholders and the output
    args: Any  # JSON-able; a tensor argument is {"ref": node name}
    kwargs: dict
    outputs: tuple[TensorMeta | None, ...]
    phase: str  # forward | backward

    def refs(self) -> list[str]:
        found: list[str] = []
        _collect_refs((self.args, self.kwargs), found)
        return found


@dataclass(frozen=True)
class GraphIR:
    nodes: tuple[IRNode, ...]
    params: dict  # placeholder -> parameter FQN
    buffers: dict  # placeholder -> buffer FQN
    inputs: tuple[str, ...]  # placeholders of user inputs, in call order
    loss: str | None  # None: a forward alone whose output holds no loss
    grads: dict  # gradient node -> parameter FQN
    outputs: tuple[str | None, ...]
    input_names: tuple[str, ...] = ()  # forward's argument name of each user input (plans of old files: none)
    training: bool = True  # the model's mode when captured
    kind: str = STEP  # STEP: forward and backward; FORWARD: forward alone
    modes: str = ""  # each module's training flag when captured (Program.modes)
    frozen: tuple[str, ...] = ()  # the parameters that took no gradient
    values: tuple[str, ...] = ()  # the model's other output tensors, which forward returns
    mutated: dict = field(default_factory=dict)  # node -> the buffer it is forward's new value of
    input_structure: str = ""  # the call's structure around its tensors (autopar.ir.call)
    output_tree: OutputTree | None = None  # the model's output rebuilt from loss and values
    autocast: str | None = None  # the low-precision dtype forward was captured under (mixed precision)
    # parameter FQN -> the FQN whose tensor it is (tied weights, kept apart for a pipeline's
    # stages: autopar.capture.capture's untie_tied)
    tied: dict = field(default_factory=dict)

    def node(self, name: str) -> IRNode:
        return self._by_name[name]

    @functools.cached_property
    def _by_name(self) -> dict:
        return {n.name: n for n in self.nodes}

    def fingerprint(self) -> str:
        """Identifies the computation: same model structure, shapes and dtypes, same call and output
        structure -> same hash (autocast's casts are ops of the graph: the computation holds them)."""
        return self._fingerprint

    @functools.cached_property
    def _fingerprint(self) -> str:
        # once per graph (the graph is frozen): runtimes name their plan by it on every program they load
        body = [[n.op, n.target, n.args, n.kwargs, [_meta_json(m) for m in n.outputs]] for n in self.nodes]
        body += [self.kind, self.training, self.modes, list(self.frozen), self.params, self.buffers, self.grads,
                 list(self.values), self.mutated, self.input_structure,
                 None if self.output_tree is None else self.output_tree.to_json()]
        if self.tied:  # (absent otherwise, so graphs without ties keep the fingerprints they had)
            body.append(self.tied)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {
            "nodes": [
                {"name": n.name, "op": n.op, "target": n.target, "args": n.args, "kwargs": n.kwargs,
                 "outputs": [_meta_json(m) for m in n.outputs], "phase": n.phase}
                for n in self.nodes
            ],
            "params": self.params, "buffers": self.buffers, "inputs": list(self.inputs), "loss": self.loss,
            "grads": self.grads, "outputs": list(self.outputs), "input_names": list(self.input_names),
            "training": self.training, "kind": self.kind, "modes": self.modes, "frozen": list(self.frozen),
            "values": list(self.values), "mutated": self.mutated,
            "input_structure": self.input_structure,
            "output_tree": None if self.output_tree is None else self.output_tree.to_json(),
            "autocast": self.autocast, "tied": self.tied,
        }

    @staticmethod
    def from_json(d: dict) -> GraphIR:
        nodes = tuple(
            IRNode(n["name"], n["op"], n["target"], n["args"], n["kwargs"],
                   tuple(None if m is None else TensorMeta(tuple(m["shape"]), m["dtype"]) for m in n["outputs"]),
                   n["phase"])
            for n in d["nodes"]
        )
        return GraphIR(nodes, dict(d["params"]), dict(d["buffers"]), tuple(d["inputs"]), d["loss"],
                       dict(d["grads"]), tuple(d["outputs"]), tuple(d.get("input_names", ())),
                       d.get("training", True), d.get("kind", STEP), d.get("modes", ""), tuple(d.get("frozen", ())),
                       tuple(d.get("values", ())),
                       dict(d.get("mutated", {})), d.get("input_structure", ""),
                       OutputTree.from_json(d.get("output_tree")), d.get("autocast"), dict(d.get("tied", {})))

    def renamed(self, names: dict) -> GraphIR:
        """This graph with node ``n`` called ``names.get(n, n)`` everywhere it appears."""
        def new(name):
            return names.get(name, name)

        nodes = tuple(dataclasses.replace(n, name=new(n.name), args=_renamed_refs(n.args, names),
                                          kwargs=_renamed_refs(n.kwargs, names)) for n in self.nodes)
        return dataclasses.replace(
            self, nodes=nodes, params={new(k): v for k, v in self.params.items()},
            buffers={new(k): v for k, v in self.buffers.items()}, inputs=tuple(map(new, self.inputs)),
            loss=None if self.loss is None else new(self.loss), grads={new(k): v for k, v in self.grads.items()},
            outputs=tuple(None if o is None else new(o) for o in self.outputs), values=tuple(map(new, self.values)),
            mutated={new(k): v for k, v in self.mutated.items()})

    @property
    def forward_outputs(self) -> list[str]:
        return forward_outputs(self)

    @property
    def gradients(self) -> list[str]:
        """The gradient outputs, in the graph's output order."""
        return [o for o in self.outputs if o is not None and o in self.grads]


def _meta_json(m: TensorMeta | None):
    return None if m is None else {"shape": list(m.shape), "dtype": m.dtype}


def _renamed_refs(value, names: dict):
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            return {"ref": names.get(value["ref"], value["ref"])}
        return {k: _renamed_refs(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_renamed_refs(v, names) for v in value)
    return value


def _collect_refs(value, found: list) -> None:
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            found.append(value["ref"])
        else:
            for v in value.values():
                _collect_refs(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_refs(v, found)


def encode_arg(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return {"ref": a.name}
    if isinstance(a, (list, tuple)):
        return [encode_arg(x) for x in a]
    if isinstance(a, dict):
        return {k: encode_arg(v) for k, v in a.items()}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": a.type}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    raise TypeError(f"cannot record argument {a!r} of type {type(a).__name__} in a plan")


def fingerprint_of(program: Program) -> str:
    """The graph fingerprint every plan of ``program`` carries, without planning it."""
    return to_ir(program, shape_table(program)).fingerprint()


def to_ir(program: Program, meta: dict | None = None) -> GraphIR:
    """``program`` as plain data; ``meta`` defaults to its shapes table (the shapes pass's)."""
    meta = program.table("meta") if meta is None else meta
    forward = forward_nodes(program)
    nodes = []
    for n in program.nodes():
        args, kwargs = encode_arg(n.args), encode_arg(dict(n.kwargs))
        if n.op in ("placeholder", "output"):
            target = ""
        elif n.op == "get_attr":
            value = program.constants[n.name]
            target, args, kwargs = "", [value.tolist()], {"dtype": encode_arg(value.dtype)}
        elif n.target is operator.getitem:
            target = "getitem"
        else:
            target = str(n.target).replace("aten::", "aten.")
        nodes.append(IRNode(
            name=n.name,
            op={"placeholder": "placeholder", "output": "output", "get_attr": "constant"}.get(n.op, "call"),
            target=target,
            args=args,
            kwargs=kwargs,
            outputs=meta.get(n.name, ()),
            phase="forward" if n.name in forward or n.op == "placeholder" else "backward",
        ))
    return GraphIR(tuple(nodes), dict(program.params), dict(program.buffers), tuple(program.user_inputs),
                   program.loss, dict(program.grads), tuple(program.outputs), tuple(program.input_names),
                   program.training, program.kind, program.modes, tuple(program.frozen), tuple(program.values),
                   dict(program.mutated),
                   program.input_structure, program.output_tree, program.autocast, dict(program.tied))


def resolve_target(target: str):
    """'aten.addmm.default' -> torch.ops.aten.addmm.default."""
    ns, name, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)
