"""Capture ``loss = model(*inputs)`` as one joint forward+backward ATen graph.

torch.export (non-strict) traces the model; AOTAutograd's joint export then adds
the backward. Both run on fake CPU tensors, so capture needs no real memory and
works the same for real models and for models built on the meta device.

The joint export is ``aot_export_joint_with_descriptors`` rather than
``aot_export_module(trace_joint=True)``: the latter traces the joint graph twice
(the second time to flatten its calling convention, which drops every node's
``nn_module_stack``); the former traces once and labels its inputs and outputs
with descriptors, which ``_to_program`` reads. Forward nodes keep the module
they came from, which ``autopar.capture.module_paths`` uses.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import os
import traceback
from collections.abc import Mapping
from typing import Optional

import torch
import torch.utils._pytree as pytree
from torch import fx, nn
from torch._functorch._aot_autograd.descriptors import (
    BufferAOTInput,
    GradAOTOutput,
    InputMutationAOTOutput,
    ParamAOTInput,
    PlainAOTInput,
    PlainAOTOutput,
    TangentAOTInput,
)
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from autopar.capture.canonicalize import canonicalize, capture_decompositions, drop_assertions
from autopar.capture.layer_expansion import (
    TRACED_LAYERS,
    CannotExpand,
    check_expanded,
    expand,
    repeated_layers,
    shortened,
)
from autopar.errors import CaptureError
from autopar.ir.program import Program

_MAX_CONSTANT_ELEMENTS = 1 << 16  # constants travel inside the plan's JSON
# frames inside torch or autopar are not the user's line that stopped the capture
_LIBRARY_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _LossOnly(nn.Module):
    """The model with its loss as the one output: AOTAutograd differentiates every output (seeding
    each with ones), so a model that also returns logits would get the gradients of their sum too."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return (loss_of(self.model.forward(*inputs)),)


def loss_of(output):
    """The loss among a model's outputs: the output itself, a ModelOutput's or a dict's ``loss``,
    or the first scalar of a tuple or list."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):  # a dict, or a Hugging Face ModelOutput
        if output.get("loss") is not None:
            return output["loss"]
        raise CaptureError(f"the model returns a {type(output).__name__} without a 'loss' (keys: "
                           f"{', '.join(map(str, output.keys()))}); pass the labels, or return the loss")
    if isinstance(output, (tuple, list)):
        scalars = [o for o in output if isinstance(o, torch.Tensor) and o.dim() == 0]
        if scalars:
            return scalars[0]
    raise CaptureError(f"the model returns {type(output).__name__}, in which autopar finds no loss: return the "
                       f"scalar loss, a tuple whose first scalar is the loss, or a dict or ModelOutput with 'loss'")


def capture(model: nn.Module, example_inputs: tuple, *, expand_layers: bool = True) -> Program:
    """The training step's joint graph. With ``expand_layers``, a model with a long list of
    identical layers is traced with five of them and the rest are copied (``layer_expansion``)."""
    if not isinstance(model, nn.Module):
        raise CaptureError(f"autopar plans nn.Module instances, got {type(model).__name__}")
    example_inputs = program_inputs(example_inputs)
    fake_mode = FakeTensorMode()
    fake_model, fake_inputs, tied = _fakify(model, example_inputs, fake_mode)
    with torch.enable_grad():  # a first call under torch.no_grad() still plans a training step
        program = _capture_step(fake_model, fake_inputs, fake_mode, tied, expand_layers)
    program.training = model.training
    program.input_names = _input_names(model, example_inputs, len(program.user_inputs))
    return program


def _capture_step(fake_model, fake_inputs, fake_mode, tied: dict, expand_layers: bool) -> Program:
    program = _capture_expanded(fake_model, fake_inputs, fake_mode, tied) if expand_layers else None
    if program is None:
        program = _to_program(_trace_joint(fake_model, fake_inputs, fake_mode))
    canonicalize(program, tied)
    return program


def _input_names(model: nn.Module, example_inputs: tuple, count: int) -> list[str]:
    """forward's parameter name for each of the ``count`` tensor inputs (``name_i`` for the
    parts of a nested input, ``input_i`` where the signature does not say)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    names = []
    for position, value in enumerate(example_inputs):
        if position < len(parameters) and parameters[position].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                                        inspect.Parameter.POSITIONAL_OR_KEYWORD):
            name = parameters[position].name
        else:
            name = f"input_{position}"
        leaves = [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]
        names += [name] if len(leaves) == 1 and isinstance(value, torch.Tensor) else \
            [f"{name}_{i}" for i in range(len(leaves))]
    return names if len(names) == count else [f"input_{i}" for i in range(count)]


def _trace_joint(fake_model: nn.Module, fake_inputs: tuple, fake_mode: FakeTensorMode) -> fx.GraphModule:
    try:
        exported = torch.export.export(_LossOnly(fake_model), fake_inputs, strict=False)
        module = exported.module()
        unused = _unused_parameters(exported)
        for name, p in module.named_parameters():
            if name in unused:  # eager gives these no gradient; AOTAutograd would insist on one
                p.requires_grad_(False)
        with contextlib.ExitStack() as stack, fake_mode:  # factory ops (arange, ...) must come out fake too
            joint = aot_export_joint_with_descriptors(stack, module, fake_inputs,
                                                      decompositions=capture_decompositions(),
                                                      _record_nn_module_stack=True)
    except CaptureError:  # ours, already saying what to do
        raise
    except Exception as exc:  # torch raises many types here; all mean "could not capture"
        raise CaptureError(_explain_capture_failure(exc)) from exc
    return joint.graph_module


def _capture_expanded(fake_model: nn.Module, fake_inputs: tuple, fake_mode: FakeTensorMode,
                      tied: dict) -> Optional[Program]:
    """Trace ``TRACED_LAYERS`` of the model's repeated layers and copy the rest; None where
    that does not apply (then every layer is traced)."""
    found = repeated_layers(fake_model)
    if found is None:
        return None
    path, layers = found
    if any(name.startswith(path + ".") for pair in tied.items() for name in pair):
        return None  # a parameter shared with a layer would not be copied right
    try:
        with shortened(fake_model, path, TRACED_LAYERS):
            traced = _to_program(_trace_joint(fake_model, fake_inputs, fake_mode))
        drop_assertions(traced)  # a layer may check a constant made before the layers run
        program = expand(traced, path, len(layers))
        check_expanded(program, fake_model)
    except (CaptureError, CannotExpand):
        return None
    program.expanded_from = f"{TRACED_LAYERS} of the {len(layers)} layers of {path} traced, the rest copied"
    return program


def program_inputs(example_inputs) -> tuple:
    """The model's positional inputs as a tuple (one bare input is allowed)."""
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _fakify(model: nn.Module, inputs: tuple, fake_mode: FakeTensorMode):
    """A structural copy of ``model`` whose parameters and buffers are fake CPU tensors.

    Tied parameters (one tensor under several names) are untied in the copy,
    because AOTAutograd's joint export requires distinct parameters; ``tied``
    maps each extra name to the first, and capture ties them again in the graph.
    """
    memo, first_name, tied = {}, {}, {}
    with fake_mode:
        def fake_param(p):
            return nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu"), requires_grad=p.requires_grad)

        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in first_name:
                tied[name] = first_name[id(p)]
            else:
                first_name[id(p)] = name
                memo[id(p)] = fake_param(p)
        for b in model.buffers():
            memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
        fake_inputs = tuple(
            torch.empty(x.shape, dtype=x.dtype, device="cpu") if isinstance(x, torch.Tensor) else x for x in inputs
        )
        copied = copy.deepcopy(model, memo)
        for name in tied:
            owner, _, leaf = name.rpartition(".")
            setattr(copied.get_submodule(owner), leaf, fake_param(copied.get_parameter(name)))
    return copied, fake_inputs, tied


def _unused_parameters(exported) -> set[str]:
    graph_inputs = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    return {fqn for ph, fqn in exported.graph_signature.inputs_to_parameters.items()
            if not graph_inputs[ph].users}


def _explain_capture_failure(exc: Exception) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_LIBRARY_DIRS)]
    where = ""
    if frames:
        f = frames[-1]
        where = f" at {f.filename}:{f.lineno}: `{(f.line or '').strip()}`"
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    hint = ""
    text = str(exc)
    if "data-dependent" in text or "GuardOnDataDependent" in type(exc).__name__ or "Could not guard" in text:
        hint = (" The model branches on a tensor's value, which one static graph cannot hold: "
                "compute both branches and select with torch.where, or move the decision out of forward().")
    return f"could not capture the model's training step{where}: {type(exc).__name__}: {first_line}.{hint}"


def _to_program(gm: fx.GraphModule) -> Program:
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output_node = next(n for n in graph.nodes if n.op == "output")
    _refuse_mutations(output_node.meta["desc"])
    kept = [(a, d) for a, d in zip(output_node.args[0], output_node.meta["desc"]) if a is not None]
    loss = next((a for a, d in kept if isinstance(d, PlainAOTOutput)), None)
    val = loss.meta.get("val") if loss is not None else None
    if not isinstance(val, torch.Tensor) or val.dim() != 0 or not val.dtype.is_floating_point:
        raise CaptureError("the model must return a scalar floating-point loss, e.g. F.cross_entropy(logits, targets)")
    _seed_backward(graph, placeholders, loss)
    output_node.args = (tuple(a for a, _ in kept),)
    desc = {n.name: n.meta["desc"] for n in placeholders}
    by_kind = {kind: {name: d for name, d in desc.items() if isinstance(d, kind)}
               for kind in (ParamAOTInput, BufferAOTInput, PlainAOTInput)}
    grads = {a.name: user_fqn(d.grad_of.target) for a, d in kept if isinstance(d, GradAOTOutput)}
    gm.recompile()
    return Program(
        gm=gm,
        constants=_constants(gm),
        params={ph: user_fqn(d.target) for ph, d in by_kind[ParamAOTInput].items()},
        buffers={ph: user_fqn(d.target) for ph, d in by_kind[BufferAOTInput].items()},
        user_inputs=sorted(by_kind[PlainAOTInput], key=lambda ph: by_kind[PlainAOTInput][ph].idx),
        loss=loss.name,
        grads=grads,
        outputs=[a.name for a, _ in kept],
    )


def _refuse_mutations(descriptors) -> None:
    """A forward that updates its buffers (BatchNorm's running statistics) or inputs in place: the
    step would neither write them back nor tell them from the loss."""
    mutated = [d.mutated_input for d in descriptors if isinstance(d, InputMutationAOTOutput)]
    if mutated:
        names = ", ".join(user_fqn(m.target) if isinstance(m, BufferAOTInput) else m.expr() for m in mutated)
        raise CaptureError(f"the model's forward updates {names} in place (BatchNorm's running statistics, say), "
                           f"which autopar does not run yet: it would neither write them back nor keep them apart "
                           f"from the loss; use a norm without running statistics (LayerNorm, GroupNorm) or "
                           f"BatchNorm(track_running_stats=False)")


def _seed_backward(graph: fx.Graph, placeholders: list[fx.Node], loss: fx.Node) -> None:
    """The joint graph takes d(loss)/d(loss) as an input; a training step starts it at one."""
    for tangent in (n for n in placeholders if isinstance(n.meta["desc"], TangentAOTInput)):
        if tangent.users:
            with graph.inserting_after(loss):
                seed = graph.call_function(torch.ops.aten.ones_like.default, (loss,), {"pin_memory": False})
            seed.meta["val"] = torch.ops.aten.ones_like.default(loss.meta["val"])
            tangent.replace_all_uses_with(seed)
        graph.erase_node(tangent)


def _constants(gm: fx.GraphModule) -> dict[str, torch.Tensor]:
    constants = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, FakeTensor) or not isinstance(value, torch.Tensor):
                raise CaptureError(f"the model makes a constant tensor ({node.target}) whose values tracing cannot "
                                   f"see; build it from a registered buffer instead")
            if value.numel() > _MAX_CONSTANT_ELEMENTS:
                raise CaptureError(f"the model makes a constant tensor of {value.numel()} elements inside "
                                   f"forward(); register it as a buffer so the plan need not carry it")
            node.meta["val"] = value
            constants[node.name] = value
    return constants


def user_fqn(fqn: str) -> str:
    return fqn.removeprefix("model.")  # drop the _LossOnly wrapper's attribute
