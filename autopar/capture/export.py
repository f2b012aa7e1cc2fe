"""Capture ``model(*args, **kwargs)`` as one ATen graph: its training step (the joint
forward+backward graph of its loss) or its forward alone.

torch.export (non-strict) traces the model; AOTAutograd's joint export then adds
the backward (none for a forward alone: no parameter then asks for a gradient). Both
run on fake CPU tensors, so capture needs no real memory and works the same for real
models and for models built on the meta device.

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
import traceback
import types
from collections.abc import Callable, Mapping

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
from autopar.capture.moe_regions import experts_as_one_op
from autopar.errors import CaptureError, NoLossError, in_library
from autopar.ir.call import FlatCall, flatten_call, frozen_parameters, key_name, module_modes, unsupported_leaves
from autopar.ir.outputs import JSON_LEAVES, OutputTree
from autopar.ir.precision import MixedPrecision
from autopar.ir.program import FORWARD, STEP, Program

_MAX_CONSTANT_ELEMENTS = 1 << 16  # constants travel inside the plan's JSON


class _Traced(nn.Module):
    """The model called on the call's tensors alone (the rest of the call is fixed), returning its
    loss first, when it has one, then every other tensor of its output, detached: AOTAutograd
    differentiates each output that requires a gradient (seeding it with ones), so a model that
    also returns logits would get the gradients of their sum too. ``outputs`` records the tree
    of the model's output, to rebuild it from the programs' results."""

    def __init__(self, model: nn.Module, call: FlatCall, loss_fn: Callable | None, needs_loss: bool,
                 autocast_dtype: torch.dtype | None = None):
        super().__init__()
        self.model = model
        self._call, self._loss_fn, self._needs_loss = call, loss_fn, needs_loss
        self.autocast_dtype = autocast_dtype
        # on a plain object: torch.export restores the module's attributes (and dicts') after tracing
        self._recorded = types.SimpleNamespace(outputs=None)

    @property
    def outputs(self) -> OutputTree:
        return self._recorded.outputs

    def forward(self, *tensors):
        args, kwargs = self._call.rebuild(tensors)
        buffers = {name: id(b) for name, b in self.model.named_buffers()}
        output = self.model.forward(*args, **kwargs)  # forward, not __call__: autoparallelize routes that
        reassigned = sorted(name for name, b in self.model.named_buffers() if buffers.get(name) != id(b))
        if reassigned:
            raise CaptureError(f"the model's forward assigns a new tensor to buffer {', '.join(reassigned)}, which "
                               f"the captured graph does not carry; update it in place (self.buf.mul_(0.5), "
                               f"self.buf.copy_(...)) so the programs write it back")
        loss = find_loss(output, self._loss_fn, self._needs_loss)
        leaves, spec = pytree.tree_flatten_with_path(output)
        described, values = [], []
        for path, leaf in leaves:
            if loss is not None and leaf is loss:
                described.append({"loss": True})
            elif isinstance(leaf, torch.Tensor):
                described.append({"value": len(values), "name": "_".join(map(str, map(key_name, path))) or "output"})
                values.append(leaf.detach())
            elif isinstance(leaf, JSON_LEAVES):
                described.append({"constant": leaf})
            else:
                described.append({"dropped": type(leaf).__name__})
        if loss is not None and not any("loss" in d for d in described):
            raise CaptureError("loss_fn returned a tensor that is not one of the model's outputs: it must pick the "
                               "loss out of the output (lambda out: out.loss); to compute a loss from the outputs, "
                               "wrap the model in a module whose forward returns it")
        self._recorded.outputs = OutputTree.of(pytree.tree_structure(output), described, type(self.model).__name__)
        return ((loss,) if loss is not None else ()) + tuple(values)


def find_loss(output, loss_fn: Callable | None = None, required: bool = True):
    """The loss among a model's outputs: ``loss_fn(output)``, else the output itself, a
    ModelOutput's or a dict's ``loss``, or the first floating-point scalar of a tuple or list.
    Where none is ``required`` (a forward alone), None where there is none or it is no loss (a
    tensor that is not a floating-point scalar: a value like any other)."""
    loss = loss_fn(output) if loss_fn is not None else _loss_in(output)
    if loss is None and required:
        raise NoLossError(_no_loss_message(output, loss_fn))
    is_loss = isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.dtype.is_floating_point
    if not required and not is_loss:
        return None
    if loss is not None and not is_loss:
        what = f"a tensor of shape {list(loss.shape)} and dtype {loss.dtype}" if isinstance(loss, torch.Tensor) \
            else type(loss).__name__
        raise CaptureError(f"the loss must be a scalar floating-point tensor (e.g. F.cross_entropy(logits, targets)); "
                           f"{'loss_fn returned' if loss_fn is not None else 'the model returned'} {what}")
    return loss


def _loss_in(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):  # a dict, or a Hugging Face ModelOutput
        return output.get("loss")
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor) and o.dim() == 0 and o.dtype.is_floating_point),
                    None)
    return None


def _no_loss_message(output, loss_fn) -> str:
    if loss_fn is not None:
        return "loss_fn returned None: the model's output holds no loss for this call (are the labels passed?)"
    if isinstance(output, Mapping):
        return (f"the model returns a {type(output).__name__} without a 'loss' (keys: "
                f"{', '.join(map(str, output.keys()))}); pass the labels, or return the loss")
    return (f"the model returns {type(output).__name__}, in which autopar finds no loss: return the scalar loss, a "
            f"tuple whose first scalar is the loss, or a dict or ModelOutput with 'loss' (or pass loss_fn=)")


def capture(model: nn.Module, example_inputs=(), *, kwargs: dict | None = None,
            loss_fn: Callable | None = None, training_step: bool = True, expand_layers: bool = True,
            precision: MixedPrecision | None = None, untie_tied: bool = False) -> Program:
    """The graph of ``model(*example_inputs, **kwargs)``: with ``training_step``, the joint
    forward+backward graph of its loss (found as find_loss says, or by ``loss_fn(output)``);
    otherwise its forward alone, in the model's current mode. Under a mixed ``precision``, the
    forward runs under CPU autocast in its compute dtype, and the graph holds the casts (the
    CPU policy: which ops autocast casts differs a little from CUDA's). With ``expand_layers``, a model
    with a long list of identical layers is traced with five of them and the rest are copied
    (``layer_expansion``). A model whose parameters are DTensors (autoparallelize's, once
    sharded) is captured with their whole shapes. A parameter shared under several names
    (tied weights) is one placeholder whose gradient sums its uses'; with ``untie_tied``, one per
    name, each with the gradient of its own uses, and ``Program.tied`` records which are one
    tensor (a pipeline holds a copy on each stage that reads it and sums their gradients)."""
    if not isinstance(model, nn.Module):
        raise CaptureError(f"autopar plans nn.Module instances, got {type(model).__name__}")
    call = flatten_call(program_inputs(example_inputs), kwargs)
    unsupported = unsupported_leaves(call)
    if unsupported:
        raise CaptureError(f"the model is called with {', '.join(unsupported)}: autopar takes tensors, numbers, "
                           f"strings and None, in tuples, lists and dicts; pass the tensors they hold instead")
    if precision is not None:
        _check_float32_masters(model, precision)
    fake_mode = FakeTensorMode()
    fake_model, fake_call, tied = _fakify(model, call, fake_mode)
    experts_as_one_op(fake_model)  # each mixture-of-experts layer one op: its layouts are one decision
    traced = _Traced(fake_model, fake_call, loss_fn, needs_loss=training_step,
                     autocast_dtype=None if precision is None else precision.compute_dtype)
    # the random state stays as it was: autoparallelize captures on rank 0 alone, in the middle of
    # a call whose dropout masks every rank then draws alike; a call under no_grad still plans its
    # step, and a forward alone asks no gradient
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), _without_stack_traces():
        program = _capture(traced, fake_call.tensors, fake_mode, tied, expand_layers=expand_layers and training_step,
                           training_step=training_step, untie_tied=untie_tied)
    program.kind = STEP if training_step else FORWARD
    program.autocast = None if precision is None else precision.compute
    program.training = model.training
    program.modes = module_modes(model)
    program.frozen = frozen_parameters(model)
    program.input_names = _input_names(model, call)
    program.input_structure = call.structure
    program.output_tree = traced.outputs
    return program


@contextlib.contextmanager
def _without_stack_traces():
    """FX records the Python stack of every node it traces (a sixth of a capture's time);
    autopar names a program's nodes by their modules (nn_module_stack), not by source lines."""
    before = fx.config.do_not_emit_stack_traces
    fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx.config.do_not_emit_stack_traces = before


def _check_float32_masters(model: nn.Module, precision: MixedPrecision) -> None:
    """Mixed precision keeps float32 parameters as the master weights; a model built in a low
    precision would train without them."""
    low = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                  if p.dtype.is_floating_point and p.dtype != torch.float32})
    if low:
        raise CaptureError(f"precision={str(precision)!r} keeps float32 parameters as master weights and computes "
                           f"in {precision.compute}, but the model's parameters are {', '.join(low)}: build it in "
                           f"float32 (model.float()), or plan without precision= to train in its own dtypes")


def _capture(traced: _Traced, fake_inputs: tuple, fake_mode, tied: dict, *, expand_layers: bool,
             training_step: bool, untie_tied: bool) -> Program:
    program = _capture_expanded(traced, fake_inputs, fake_mode, tied) if expand_layers else None
    if program is None:
        gm = _trace_joint(traced, fake_inputs, fake_mode, training_step)
        program = _to_program(gm, has_loss=any("loss" in leaf for leaf in traced.outputs.leaves))
    if len(program.values) != sum("value" in leaf for leaf in traced.outputs.leaves):
        raise CaptureError("the model returns a tensor that is a view of one of its inputs, which the programs "
                           "cannot return as the model does; return a copy (x.clone()) or leave it out")
    if untie_tied:
        names = set(program.params.values())
        program.tied = {alias: primary for alias, primary in tied.items() if alias in names and primary in names}
    canonicalize(program, {} if untie_tied else tied)
    return program


def _input_names(model: nn.Module, call: FlatCall) -> list[str]:
    """A name for each tensor of the call: forward's parameter name (``input_i`` where the
    signature does not say), or the keyword, then the keys of a nested input (``batch_x``)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                           inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    names = []
    for path in call.paths:
        kind, first, rest = path[0], path[1], path[2:]
        base = (positional[first] if first < len(positional) else f"input_{first}") if kind == 0 else str(first)
        names.append("_".join([base] + [str(k) for k in rest]))
    return names


def _trace_joint(traced: _Traced, fake_inputs: tuple, fake_mode: FakeTensorMode,
                 training_step: bool) -> fx.GraphModule:
    # Under mixed precision both traces run under autocast: the model's Python code sees the
    # dtypes it sees in eager autocast (``x.to(input_dtype)``), and the joint graph gets the casts
    autocast = contextlib.nullcontext() if traced.autocast_dtype is None else \
        torch.autocast("cpu", dtype=traced.autocast_dtype)
    # imported here: it loads Dynamo and Inductor's modules (a second a process), which a rank
    # that only runs programs never needs
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    try:
        with autocast:
            exported = torch.export.export(traced, fake_inputs, strict=False)
        module = exported.module()
        unused = _unused_parameters(exported)
        for name, p in module.named_parameters():
            if name in unused or not training_step:  # eager gives these no gradient; AOTAutograd would insist
                p.requires_grad_(False)
        with contextlib.ExitStack() as stack, fake_mode:  # factory ops (arange, ...) must come out fake too
            stack.enter_context(autocast)
            joint = aot_export_joint_with_descriptors(stack, module, fake_inputs,
                                                      decompositions=capture_decompositions(),
                                                      _record_nn_module_stack=True)
    except CaptureError:  # ours, already saying what to do
        raise
    except Exception as exc:  # torch raises many types here; all mean "could not capture"
        what = "training step" if training_step else "forward"
        raise CaptureError(_explain_capture_failure(exc, what)) from exc
    return joint.graph_module


def _capture_expanded(traced: _Traced, fake_inputs: tuple, fake_mode: FakeTensorMode,
                      tied: dict) -> Program | None:
    """Trace ``TRACED_LAYERS`` of the model's repeated layers and copy the rest; None where
    that does not apply (then every layer is traced)."""
    fake_model = traced.model
    found = repeated_layers(fake_model)
    if found is None:
        return None
    path, layers = found
    if any(name.startswith(path + ".") for pair in tied.items() for name in pair):
        return None  # a parameter shared with a layer would not be copied right
    try:
        with shortened(fake_model, path, TRACED_LAYERS):
            short = _to_program(_trace_joint(traced, fake_inputs, fake_mode, True), has_loss=True)
        if short.mutated:
            return None  # the layers' buffer updates are not copied
        drop_assertions(short)  # a layer may check a constant made before the layers run
        program = expand(short, path, len(layers))
        check_expanded(program, fake_model)
    except (CaptureError, CannotExpand):
        return None
    program.expanded_from = f"{TRACED_LAYERS} of the {len(layers)} layers of {path} traced, the rest copied"
    return program


def program_inputs(example_inputs) -> tuple:
    """The model's positional inputs as a tuple (one bare input is allowed)."""
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _fakify(model: nn.Module, call: FlatCall, fake_mode: FakeTensorMode):
    """A structural copy of ``model`` whose parameters and buffers are fake CPU tensors (of their
    whole shape, for DTensors), and ``call`` with fake tensors.

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
        fake_call = flatten_call(*call.rebuild(torch.empty(x.shape, dtype=x.dtype, device="cpu")
                                               for x in call.tensors))
        copied = copy.deepcopy(model, memo)
        for name in tied:
            owner, _, leaf = name.rpartition(".")
            setattr(copied.get_submodule(owner), leaf, fake_param(copied.get_parameter(name)))
    return copied, fake_call, tied


def _unused_parameters(exported) -> set[str]:
    graph_inputs = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    return {fqn for ph, fqn in exported.graph_signature.inputs_to_parameters.items()
            if not graph_inputs[ph].users}


def _explain_capture_failure(exc: Exception, what: str) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not in_library(f.filename)]
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
    return f"could not capture the model's {what}{where}: {type(exc).__name__}: {first_line}.{hint}"


def _to_program(gm: fx.GraphModule, has_loss: bool) -> Program:
    """The traced graph as a Program. Its outputs, as AOTAutograd orders them: the buffers forward
    updates, then what _Traced returns (the loss, when ``has_loss``, then the other values),
    then the gradients."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output_node = next(n for n in graph.nodes if n.op == "output")
    pairs = [(a, d) for a, d in zip(output_node.args[0], output_node.meta["desc"]) if a is not None]
    mutated = _buffer_updates(pairs)
    returned = [a for _, a in sorted(((d.idx, a) for a, d in pairs if isinstance(d, PlainAOTOutput)),
                                     key=lambda pair: pair[0])]
    if not returned and not mutated:
        raise CaptureError("the model's forward returns no tensor and updates no buffer: there is nothing to run")
    loss = returned[0] if has_loss else None
    values = returned[1:] if has_loss else returned
    tangents = [n for n in placeholders if isinstance(n.meta["desc"], TangentAOTInput)]
    _forward_outputs_before_backward(graph, returned + list(mutated), tangents)
    _seed_backward(graph, tangents, loss, after=_last(graph, returned + list(mutated)))
    output_node.args = (tuple(a for a, _ in pairs),)
    desc = {n.name: n.meta["desc"] for n in placeholders}
    by_kind = {kind: {name: d for name, d in desc.items() if isinstance(d, kind)}
               for kind in (ParamAOTInput, BufferAOTInput, PlainAOTInput)}
    grads = {a.name: user_fqn(d.grad_of.target) for a, d in pairs if isinstance(d, GradAOTOutput)}
    gm.recompile()
    return Program(
        gm=gm,
        constants=_constants(gm),
        params={ph: user_fqn(d.target) for ph, d in by_kind[ParamAOTInput].items()},
        buffers={ph: user_fqn(d.target) for ph, d in by_kind[BufferAOTInput].items()},
        user_inputs=sorted(by_kind[PlainAOTInput], key=lambda ph: by_kind[PlainAOTInput][ph].idx),
        loss=None if loss is None else loss.name,
        grads=grads,
        outputs=[a.name for a, _ in pairs],
        values=[v.name for v in values],
        mutated={node.name: fqn for node, fqn in mutated.items()},
    )


def _buffer_updates(pairs) -> dict:
    """node -> the buffer it is the new value of (BatchNorm's running statistics); an input or
    parameter updated in place is refused: the programs hand back no new value for those."""
    updates, refused = {}, []
    for node, d in pairs:
        if isinstance(d, InputMutationAOTOutput):
            if isinstance(d.mutated_input, BufferAOTInput):
                updates[node] = user_fqn(d.mutated_input.target)
            else:
                refused.append(user_fqn(d.mutated_input.target) if isinstance(d.mutated_input, ParamAOTInput)
                               else d.mutated_input.expr())
    if refused:
        raise CaptureError(f"the model's forward changes {', '.join(refused)} in place; autopar runs forwards that "
                           f"update buffers (BatchNorm's running statistics) but not ones that change a parameter or "
                           f"an input: compute a new tensor instead")
    return updates


def _forward_outputs_before_backward(graph: fx.Graph, outputs: list, tangents: list) -> None:
    """Move forward outputs that AOTAutograd placed after backward began (a value aliasing a buffer
    forward updates is regenerated at the end), with what they read from there, to just before
    backward's first op: the forward program returns them."""
    backward = set()
    for tangent in tangents:
        backward |= _descendants(tangent)
    order = list(graph.nodes)
    first = next((n for n in order if n in backward and n.op != "placeholder"), None)
    if first is None:
        return
    start = order.index(first)
    late = {n for n in outputs if order.index(n) > start}
    stack = list(late)
    while stack:
        for arg in stack.pop().all_input_nodes:
            if arg not in late and order.index(arg) > start:
                late.add(arg)
                stack.append(arg)
    if late & backward:
        raise CaptureError("the model returns a value computed from gradients; return forward values only")
    for node in (n for n in order if n in late):
        first.prepend(node)


def _descendants(node: fx.Node) -> set:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.users)
    return seen


def _last(graph: fx.Graph, nodes: list) -> fx.Node:
    order = {n: i for i, n in enumerate(graph.nodes)}
    return max(nodes, key=order.__getitem__)


def _seed_backward(graph: fx.Graph, tangents: list[fx.Node], loss: fx.Node | None, after: fx.Node) -> None:
    """The joint graph takes d(loss)/d(loss) as an input; a training step starts it at one,
    right after forward's last output (backward begins there)."""
    for tangent in tangents:
        if tangent.users:
            with graph.inserting_after(after):
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
    return fqn.removeprefix("model.")  # drop the _Traced wrapper's attribute
