"""Capture ``loss = model(*inputs)`` as one joint forward+backward ATen graph.

torch.export (non-strict) traces the model; AOTAutograd's joint export then adds
the backward. Both run on fake CPU tensors, so capture needs no real memory and
works the same for real models and for models built on the meta device.
"""
from __future__ import annotations

import copy
import os
import traceback

import torch
from torch import fx, nn
from torch._functorch.aot_autograd import aot_export_module
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from autopar.canonicalize import canonicalize, capture_decompositions
from autopar.errors import CaptureError
from autopar.program import Program

_MAX_CONSTANT_ELEMENTS = 1 << 16  # constants travel inside the plan's JSON
_LIBRARY_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))


class _LossOnly(nn.Module):
    """AOTAutograd wants tuple outputs; users write ``return loss``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return (self.model.forward(*inputs),)


def capture(model: nn.Module, example_inputs: tuple) -> Program:
    if not isinstance(model, nn.Module):
        raise CaptureError(f"autopar plans nn.Module instances, got {type(model).__name__}")
    example_inputs = program_inputs(example_inputs)
    fake_mode = FakeTensorMode()
    fake_model, fake_inputs, tied = _fakify(model, example_inputs, fake_mode)
    wrapper = _LossOnly(fake_model)
    try:
        exported = torch.export.export(wrapper, fake_inputs, strict=False)
        module = exported.module()
        unused = _unused_parameters(exported)
        for name, p in module.named_parameters():
            if name in unused:  # eager gives these no gradient; AOTAutograd would insist on one
                p.requires_grad_(False)
        with fake_mode:  # factory ops (arange, ...) must come out fake too
            joint, signature = aot_export_module(module, fake_inputs, trace_joint=True,
                                                 output_loss_index=0, decompositions=capture_decompositions())
    except Exception as exc:  # torch raises many types here; all mean "could not capture"
        raise CaptureError(_explain_capture_failure(exc)) from exc
    program = _to_program(joint, signature)
    program.exported = exported
    canonicalize(program, tied)
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


def _to_program(gm: fx.GraphModule, signature) -> Program:
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = [a.name if isinstance(a, fx.Node) else None for a in output_node.args[0]]
    loss = signature.backward_signature.loss_output
    val = _node(gm, loss).meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 0 or not val.dtype.is_floating_point:
        raise CaptureError("the model must return a scalar floating-point loss, e.g. F.cross_entropy(logits, targets)")
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
    return Program(
        gm=gm,
        constants=constants,
        params={ph: user_fqn(f) for ph, f in signature.inputs_to_parameters.items()},
        buffers={ph: user_fqn(f) for ph, f in signature.inputs_to_buffers.items()},
        user_inputs=list(signature.user_inputs),
        loss=loss,
        grads={g: user_fqn(f) for g, f in signature.backward_signature.gradients_to_parameters.items()},
        outputs=outputs,
    )


def user_fqn(fqn: str) -> str:
    return fqn.removeprefix("model.")  # drop the _LossOnly wrapper's attribute


def _node(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)
