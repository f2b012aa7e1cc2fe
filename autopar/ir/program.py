"""Program: the captured graph (a training step's joint forward+backward, or a forward alone)
plus typed side tables.

Analyses never set attributes on ``fx.Node``; they live in ``Program.tables``
keyed by node name, so that passes stay independent and the plan stays data.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from autopar.errors import AutoparError
from autopar.ir.outputs import OutputTree

STEP = "step"  # a program kind: a training step, forward and backward
FORWARD = "forward"  # a program kind: forward alone (evaluation, or a call under no_grad)


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str

    @property
    def itemsize(self) -> int:
        return getattr(torch, self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n

    @property
    def is_floating(self) -> bool:
        return getattr(torch, self.dtype).is_floating_point

    @staticmethod
    def of(value: Any) -> TensorMeta | None:
        if isinstance(value, torch.Tensor):
            return TensorMeta(tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch."))
        return None


@dataclass
class Program:
    gm: fx.GraphModule
    params: dict[str, str]  # placeholder name -> parameter FQN
    buffers: dict[str, str]  # placeholder name -> buffer FQN
    user_inputs: list[str]  # placeholder names of the model's own inputs, in order
    loss: str | None  # node name of the scalar loss (None: a forward alone whose output holds none)
    grads: dict[str, str]  # node name of a gradient -> parameter FQN
    outputs: list[str | None]  # the graph's outputs in order: buffer updates, loss, values, gradients
    values: list[str] = field(default_factory=list)  # the model's other output tensors, as forward returns them
    mutated: dict[str, str] = field(default_factory=dict)  # node -> the buffer it is forward's new value of
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # get_attr node -> small real tensor
    tables: dict[str, dict] = field(default_factory=dict)
    expanded_from: str | None = None  # how capture copied repeated layers (layer_expansion)
    input_names: list[str] = field(default_factory=list)  # forward's argument name of each user input
    training: bool = True  # the model's mode when captured (dropout on, ...)
    kind: str = STEP  # STEP: forward and backward; FORWARD: forward alone
    modes: str = ""  # each module's training flag when captured, in model.modules() order ("1": training)
    frozen: tuple[str, ...] = ()  # the parameters that took no gradient (requires_grad False)
    input_structure: str = ""  # the call's structure around its tensors (autopar.ir.call.FlatCall)
    output_tree: OutputTree | None = None  # how the programs' results become the model's output
    autocast: str | None = None  # the low-precision dtype forward was captured under (mixed precision)
    tied: dict[str, str] = field(default_factory=dict)  # parameter FQN -> the FQN whose tensor it is (untied)
    # while a pass runs, the side tables it declared (requires, provides, optional): the only ones
    # it may read; None outside the PassManager
    readable: frozenset | None = field(default=None, repr=False, compare=False)
    _by_name: dict = field(default_factory=dict, repr=False, compare=False)

    def nodes(self) -> list[fx.Node]:
        return list(self.gm.graph.nodes)

    def node(self, name: str) -> fx.Node:
        found = self._by_name.get(name)
        if found is None or found.graph is not self.gm.graph or getattr(found, "_erased", False) \
                or found.name != name:  # the graph changed since the index was built
            self._by_name = {n.name: n for n in self.gm.graph.nodes}
            found = self._by_name.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def gradient_targets(self) -> list[tuple[str, str]]:
        """(gradient node, placeholder of the parameter it belongs to) for every gradient."""
        placeholder = {fqn: ph for ph, fqn in self.params.items()}
        return [(grad, placeholder[fqn]) for grad, fqn in self.grads.items()]

    def table(self, name: str) -> dict:
        self._check_declared(name)
        if name not in self.tables:
            raise KeyError(f"side table {name!r} is missing: a pass that provides it must run first")
        return self.tables[name]

    def table_if_present(self, name: str) -> dict | None:
        """A side table an earlier pass may have written (declared in the pass's ``optional``)."""
        self._check_declared(name)
        return self.tables.get(name)

    def _check_declared(self, name: str) -> None:
        if self.readable is not None and name not in self.readable:
            raise AutoparError(f"a pass read side table {name!r} without declaring it: add it to the pass's "
                               f"requires (or optional, if it may be absent)")


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    """The node's tensor arguments in flattened (args, kwargs) order, repeats included."""
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), found.append)  # 20x pytree's speed; plans call it 100k times
    return found


def output_metas(node: fx.Node) -> tuple[TensorMeta | None, ...]:
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        return tuple(TensorMeta.of(v) for v in val)
    return (TensorMeta.of(val),)


def shape_table(program: Program) -> dict[str, tuple[TensorMeta | None, ...]]:
    """node name -> its global output shapes and dtypes, from the fake-tensor trace."""
    return {node.name: output_metas(node) for node in program.nodes() if node.op != "output"}


def is_multi_output(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))


def producer_of(arg: fx.Node) -> tuple[fx.Node, int]:
    """Resolve ``getitem(tuple_node, i)`` to (tuple_node, i); other nodes to (node, 0)."""
    if arg.op == "call_function" and arg.target is operator.getitem and is_multi_output(arg.args[0]):
        return arg.args[0], arg.args[1]
    return arg, 0


def forward_outputs(program) -> list[str]:
    """What the forward program returns, in order: the loss, the other values, the buffers' new
    values (``program``: a Program or a GraphIR)."""
    return ([program.loss] if program.loss is not None else []) + list(program.values) + list(program.mutated)


def forward_nodes(program: Program) -> set[str]:
    """Forward's outputs and everything they depend on; the rest of the joint graph is backward."""
    seen: set[str] = set()
    stack = [program.node(name) for name in forward_outputs(program)]
    while stack:
        n = stack.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        stack.extend(n.all_input_nodes)
    return seen


def descendants(nodes) -> set[str]:
    """Names of ``nodes`` and of every node that reads them, directly or not."""
    seen: set[str] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n.name not in seen:
            seen.add(n.name)
            stack.extend(n.users)
    return seen
