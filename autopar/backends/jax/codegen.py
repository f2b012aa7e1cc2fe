"""JAX backend: the plan as a standalone JAX module.

The per-rank programs are the torch backend's (the same statements from
autopar.lowering.schedule, one op per line: ``forward_local`` and ``backward_local``,
composed by ``local_step``) run inside ``jax.shard_map``: each
ATen op becomes a call of its JAX translation (autopar.backends.jax.aten, whose
source the module carries), each collective an explicit ``lax`` collective on
the named mesh axis. Parameters and inputs are placed with ``NamedSharding``
from the plan's placements. The module exposes ``train_step(params, batch) ->
(loss, grads)`` under ``jax.jit``, SGD and AdamW updates, and a ``main`` that
runs one step on a saved parameter file and batch.

Dropout masks are arguments of the step, drawn for the whole tensor and placed
like the dropout's output, so every layout drops the same elements: the module
draws them from a ``jax.random`` key (``--seed``), and autopar.check passes
torch's (``--masks``) to compare exactly with the single-process model.
"""
from __future__ import annotations

import inspect

import torch

from autopar.backends.jax.aten import TABLE, helpers_of
from autopar.backends.jax.decompose import decomposed_function, has_decomposition, local_inputs
from autopar.backends.jax.user_ops import USER_TRANSLATIONS
from autopar.backends.printer import (
    Sections,
    call_arguments,
    constant_note,
    header,
    indented,
    kernel_axis,
    literal,
    local_call,
    torch_name,
    wrapped,
)
from autopar.errors import AutoparError
from autopar.ir.placement import Shard
from autopar.ir.program import STEP
from autopar.lowering.naming import readable
from autopar.lowering.schedule import Statement, programs


def emit_jax(plan) -> str:
    """The module's source; an op without a translation is an AutoparError naming it, its node
    and the module it came from."""
    _refuse_what_jax_does_not_return(plan)
    named = readable(plan)  # printed with readable names; the hash is the plan's
    program = programs(named)
    printer, sections = _Printer(named), Sections(named)
    # forward's last statement returns the model's other outputs too, which train_step leaves out
    forward = [line for s in program.forward[:-1] for line in sections.before(s, "forward") + printer.lines(s)]
    backward = [line for s in program.backward for line in sections.before(s, "backward") + printer.lines(s)]
    g = named.graph
    placeholders = [n.name for n in g.nodes if n.op == "placeholder"]
    outputs = [("loss", None)] + [("grad", g.grads[name]) for name in g.gradients]
    lines = header(plan, "autopar: training step as a sharded JAX program (generated; do not edit)")
    lines += _PRELUDE.splitlines()
    lines += [
        f"PLAN_HASH = {plan.hash!r}",
        f"AXES = {tuple(plan.mesh.axis_names)!r}",
        f"SHAPE = {tuple(plan.mesh.shape)!r}",
    ]
    lines += wrapped("PLACEHOLDERS = [", [repr(n) for n in placeholders], "]")
    lines += ["# placeholder -> parameter name"] + wrapped("PARAMETERS = {", _entries(g.params), "}")
    lines += ["# placeholder -> buffer name"] + wrapped("BUFFERS = {", _entries(g.buffers), "}")
    lines += ["# placeholders of the batch, in forward's argument order"]
    lines += wrapped("INPUTS = [", [repr(n) for n in g.inputs], "]")
    lines += wrapped("SPECS = {", [f"{n!r}: {_partition_spec(named, n)}" for n in placeholders], "}")
    lines += ["# dropout mask -> (global shape, probability of a zero), in the order forward draws them"]
    lines += wrapped("MASKS = {", [f"{m!r}: ({shape!r}, {p!r})" for m, (shape, p, _) in printer.masks.items()], "}")
    lines += wrapped("MASK_SPECS = {", [f"{m!r}: {spec}" for m, (_, _, spec) in printer.masks.items()], "}")
    lines += ["# (kind, parameter name) of each value local_step returns"]
    lines += wrapped("OUTPUTS = [", [repr(o) for o in outputs], "]")
    lines += wrapped("OUTPUT_SPECS = (", ["P()"] + [_partition_spec(named, _placeholder_of(g, fqn))
                                                   for _, fqn in outputs[1:]], ",)")
    lines += ["", "", "# ---- ATen ops in JAX (autopar.backends.jax.aten) ----"]
    for function in printer.helpers():
        lines += inspect.getsource(function).splitlines() + [""]
    for function_lines in printer.decomposed:
        lines += function_lines + [""]
    masks = list(printer.masks)
    lines += [""] + wrapped("def forward_local(", placeholders + masks, "):")
    lines += indented(['"""One rank\'s forward program on its local blocks: (loss, the values backward reads)."""']
                      + forward + wrapped(f"return {g.loss}, [", list(program.saved), "]"))
    lines += ["", ""] + wrapped("def backward_local(", placeholders + ["saved"], "):")
    lines += indented(['"""One rank\'s backward program: the gradients, in OUTPUTS\' order after the loss."""']
                      + (wrapped("[", list(program.saved), "] = saved") if program.saved else []))
    lines += indented(backward)
    lines += ["", ""] + wrapped("def local_step(", placeholders + masks, "):")
    lines += indented(['"""One rank\'s training step (run under shard_map): (loss, *gradients)."""',
                       f"loss, saved = forward_local({', '.join(placeholders + masks)})",
                       f"return (loss,) + backward_local({', '.join(placeholders + ['saved'])})"])
    lines += _EPILOGUE.splitlines()
    return "\n".join(lines) + "\n"


def dropout_masks(plan) -> dict:
    """The step's dropout masks in the order its forward draws them: argument name -> (global
    shape, p, the dropped tensor's dtype)."""
    named = readable(plan)
    return {_mask_name(s.node): (list(s.node.outputs[0].shape), float(s.node.args[1]), s.node.outputs[0].dtype)
            for s in programs(named).forward if s.kind == "call" and _draws_mask(s.node)}


def _draws_mask(node) -> bool:
    return node.target == "aten.native_dropout.default" and node.args[2] is not False


def _mask_name(node) -> str:
    return f"mask_{node.name}"


def _refuse_what_jax_does_not_return(plan) -> None:
    """The JAX module is a training step returning the loss and the gradients: a forward alone,
    or a forward that updates buffers, would lose what it computes; its collectives move each
    value in its own dtype."""
    if plan.graph.kind != STEP:
        raise AutoparError(f"plan {plan.hash} is of a forward alone (an evaluation program); the JAX backend emits "
                           f"training steps: emit this plan for torch")
    if plan.graph.mutated:
        raise AutoparError(f"the model's forward updates {', '.join(sorted(plan.graph.mutated.values()))} "
                           f"(running statistics); the JAX program does not return new buffer values yet: emit the "
                           f"torch program, or use a norm without running statistics")
    if any(r.wire_dtype is not None for r in plan.redistributions):
        raise AutoparError(f"plan {plan.hash} reduces gradients in {plan.graph.autocast} (MixedPrecision(reduce=...)), "
                           f"which the JAX program does not do yet: emit the torch program, or plan with "
                           f"precision='bf16-mixed' (gradients reduced in float32)")


class _Printer:
    def __init__(self, plan):
        self.plan = plan
        self.used: dict = {}  # helper function -> its name, in first-use order
        self.masks: dict = {}  # dropout mask argument -> (global shape, p, partition spec), as forward draws them
        self.decomposed: list = []  # the source lines of each op's decomposition into ops of the table

    def helpers(self) -> list:
        """The translations the program calls, each after the functions it calls."""
        out: list = []
        for function in self.used:
            for f in helpers_of(function) + [function]:
                if f not in out:
                    out.append(f)
        return out

    def lines(self, s: Statement) -> list[str]:
        text = getattr(self, s.kind)(s)
        if text is None:
            return []
        if s.recomputed:
            text += (" [" if "  # " in text else "  # [") + "recomputed for backward]"
        return [text]

    def placeholder(self, s: Statement):
        return None

    def constant(self, s: Statement) -> str:
        node = s.node
        values = literal(node.args[0], str, _special)
        dtype, shape = _special(node.kwargs["dtype"]), list(node.outputs[0].shape)
        return f"{s.defines} = jnp.asarray({values}, dtype={dtype}).reshape({shape})"

    def call(self, s: Statement) -> str:
        node = s.node
        target, args = local_call(self.plan, node)
        axis = kernel_axis(self.plan, node)
        if axis is not None:
            raise AutoparError(f"the JAX backend does not emit {target} yet ({self._origin(node)}, runs it under "
                               f"this plan: a runtime kernel of the ranks of mesh axis {axis!r}, as expert "
                               f"parallelism and context parallelism run); emit this plan for torch, or plan with "
                               f"that layout forbidden (docs/moe.md and docs/context-parallel.md show the pass)")
        function = TABLE.get(target, USER_TRANSLATIONS.get(target))
        if function is None and has_decomposition(target):
            return f"{s.defines} = {self._decomposed(node, target, args)}({', '.join(s.uses)})"
        if function is None:
            raise AutoparError(f"the JAX backend has no translation of {target} ({self._origin(node)}) and "
                               f"PyTorch has no Core ATen decomposition of it; {_HOW_TO_ADD}")
        self.used.setdefault(function, function.__name__)
        arguments = call_arguments(args, s, _special)
        if _draws_mask(node):
            arguments += f", mask={self._mask_of(node)}"
        note = constant_note(self.plan, node)
        return f"{s.defines} = {function.__name__}({arguments})" + (f"  # {note}" if note else "")

    def _decomposed(self, node, target: str, args: list) -> str:
        """The name of a function computing ``node`` (``target`` on this rank's ``args``) in ops of the
        table (autopar.backends.jax.decompose)."""
        name = f"decomposed_{node.name}"
        try:
            lines, calls = decomposed_function(name, target, args, node.kwargs,
                                               local_inputs(self.plan, node), TABLE,
                                               lambda dtype: _special({"dtype": str(dtype).removeprefix("torch.")}))
        except Exception as e:  # an op outside the table, or a decomposition that does not trace on these shapes
            raise AutoparError(f"the JAX backend has no translation of {target} ({self._origin(node)}), and "
                               f"its Core ATen decomposition does not translate: {e}; {_HOW_TO_ADD}") from e
        for function in calls:
            self.used.setdefault(function, function.__name__)
        self.decomposed.append(lines)
        return name

    def _origin(self, node) -> str:
        module = self.plan.modules.get(node.name)
        where = f"module {module or '<model>'}" if module is not None else "no module (autograd's backward)"
        return f"node {node.name}, from {where}"

    def _mask_of(self, node) -> str:
        """The mask argument of a dropout, for its whole output, laid out as the output is."""
        name = _mask_name(node)
        spec = self.plan.strategies[node.name].out_specs[0]
        self.masks[name] = (list(node.outputs[0].shape), float(node.args[1]), _spec_text(self.plan, spec, node))
        return name

    def getitem(self, s: Statement) -> str:
        return f"{s.defines} = {s.uses[0]}[{s.node.args[1]}]"

    def move(self, s: Statement) -> str:
        r = s.redistribution
        return f"{s.defines} = {_collective(r.steps[s.step], s.uses[0], self.plan.mesh)}  # {r.id}: {r.src} -> {r.dst}"

    def start(self, s: Statement) -> str:  # XLA schedules the overlap itself: the sync is one call
        return self.move(s)

    def wait(self, s: Statement) -> str:
        return f"{s.defines} = {s.uses[0]}"

    def output(self, s: Statement) -> str:
        return f"return ({', '.join(s.uses)},)"


_HOW_TO_ADD = ("register a translation with autopar.register_jax_translation (your own op), add one to "
               "autopar/backends/jax/aten/table.py (an ATen op, with its OpInfo test in tests/test_jax_ops.py), or "
               "emit the torch program")


# one collective step in JAX, on the named axis (x: the variable, p: the axis size)
_COLLECTIVES = {
    "all_reduce": "lax.psum({x}, {axis})",
    "all_gather": "lax.all_gather({x}, {axis}, axis={dim}, tiled=True)",
    "reduce_scatter": "lax.psum_scatter({x}, {axis}, scatter_dimension={dim}, tiled=True)",
    "all_to_all": "lax.all_to_all({x}, {axis}, {dim}, {src_dim}, tiled=True)",  # split dim, gather src_dim
    "shard": "block({x}, {axis}, {p}, {dim})",
    "zero_partial": "jnp.where(lax.axis_index({axis}) == 0, {x}, jnp.zeros_like({x}))",
}


def _collective(step, var: str, mesh) -> str:
    if step.kind not in _COLLECTIVES:
        raise AutoparError(f"the JAX backend cannot emit the collective step {step.kind!r}")
    return _COLLECTIVES[step.kind].format(x=var, axis=repr(mesh.axis_names[step.axis]), p=mesh.shape[step.axis],
                                          dim=step.dim, src_dim=step.src_dim)


def _entries(mapping: dict) -> list[str]:
    return [f"{k!r}: {v!r}" for k, v in mapping.items()]


def _partition_spec(plan, placeholder: str) -> str:
    return _spec_text(plan, plan.out_spec(placeholder), plan.graph.node(placeholder))


def _spec_text(plan, spec, node) -> str:
    """``P(...)`` of a node's first output laid out as ``spec`` (a partial sum: replicated)."""
    dims: list = [[] for _ in node.outputs[0].shape]
    for axis, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            dims[p.dim].append(plan.mesh.axis_names[axis])
    return "P(" + ", ".join(repr(d[0] if len(d) == 1 else tuple(d) if d else None) for d in dims) + ")"


def _placeholder_of(graph, fqn: str) -> str:
    return next(ph for ph, name in graph.params.items() if name == fqn)


_DTYPES = {"float32": "jnp.float32", "float16": "jnp.float16", "bfloat16": "jnp.bfloat16", "float64": "jnp.float64",
           "int64": "jnp.int32", "int32": "jnp.int32", "bool": "jnp.bool_"}  # JAX's default ints are 32-bit


def _special(value: dict) -> str | None:
    if "dtype" in value:
        torch_name(torch.dtype, value["dtype"])  # a torch dtype's name, or the plan is corrupt
        return _DTYPES.get(value["dtype"], f"jnp.{value['dtype']}")
    if "device" in value or "layout" in value or "memory_format" in value:
        return "None"
    return None


_PRELUDE = '''"""Run it: python THIS_FILE.py --params params.npz --batch batch.npz [--grads out.npz] [--seed N]
(one step; prints the loss; dropout masks are drawn from jax.random.key(N), or read from --masks masks.npz).
On several hosts, set JAX's multi-host variables (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) on each and run the same file: it calls jax.distributed.initialize()."""
import argparse
import math
import os

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

'''

_EPILOGUE = '''

def block(x, axis, size, dim):
    """This rank's block of a replicated value along ``dim`` (Replicate -> Shard)."""
    n = x.shape[dim] // size
    return lax.dynamic_slice_in_dim(x, lax.axis_index(axis) * n, n, dim)


def make_mesh(devices=None):
    devices = np.asarray(jax.devices() if devices is None else devices)[: math.prod(SHAPE)]
    if devices.size < math.prod(SHAPE):
        raise RuntimeError(f"this plan needs {math.prod(SHAPE)} devices on a mesh {dict(zip(AXES, SHAPE))}; JAX sees "
                           f"{devices.size} (on CPU: "
                           f"XLA_FLAGS=--xla_force_host_platform_device_count={math.prod(SHAPE)})")
    return Mesh(devices.reshape(SHAPE), AXES)


def draw_masks(key):
    """Every dropout's mask for the whole tensor (True: kept), each from its own fold of ``key``."""
    return {name: jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - p, tuple(shape))
            for i, (name, (shape, p)) in enumerate(MASKS.items())}


def place(params, batch, mesh, masks=None):
    """The step's arguments, each laid out over the mesh as the plan places it (``masks``: name ->
    the dropout masks for the whole tensors; see draw_masks)."""
    values = []
    for name in PLACEHOLDERS:
        if name in PARAMETERS:
            value = params[PARAMETERS[name]]
        elif name in BUFFERS:
            value = params[BUFFERS[name]]
        else:
            value = batch[INPUTS.index(name)]
        values.append(jax.device_put(jnp.asarray(value), NamedSharding(mesh, SPECS[name])))
    if MASKS and masks is None:
        raise ValueError(f"this step draws {len(MASKS)} dropout masks: pass masks=draw_masks(jax.random.key(seed))")
    for name in MASKS:
        values.append(jax.device_put(jnp.asarray(masks[name], dtype=jnp.bool_), NamedSharding(mesh, MASK_SPECS[name])))
    return values


def train_step_fn(mesh):
    """jit(shard_map(local_step)): (placed arguments) -> (loss, *gradients)."""
    in_specs = tuple(SPECS[n] for n in PLACEHOLDERS) + tuple(MASK_SPECS[n] for n in MASKS)
    sharded = jax.shard_map(local_step, mesh=mesh, in_specs=in_specs, out_specs=OUTPUT_SPECS, check_vma=False)
    return jax.jit(sharded)


def train_step(params, batch, mesh=None, masks=None, seed=0):
    """(loss, {parameter name: gradient}) for ``params`` (name -> array) and ``batch`` (the model's
    inputs); dropout masks are ``masks`` (name -> whole mask) or drawn from ``seed``."""
    mesh = make_mesh() if mesh is None else mesh
    masks = draw_masks(jax.random.key(seed)) if masks is None else masks
    out = train_step_fn(mesh)(*place(params, batch, mesh, masks))
    return out[0], {fqn: g for (_, fqn), g in zip(OUTPUTS[1:], out[1:])}


def sgd_update(params, grads, lr=0.1):
    return {k: v - lr * grads[k] if k in grads else v for k, v in params.items()}


def adamw_update(params, grads, state, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """One AdamW step (Loshchilov and Hutter 2019); ``state`` starts as {} and is returned updated."""
    step = state.get("step", 0) + 1
    new_params, new_state = {}, {"step": step}
    for k, v in params.items():
        if k not in grads:
            new_params[k] = v
            continue
        m = betas[0] * state.get(("m", k), 0.0) + (1 - betas[0]) * grads[k]
        s = betas[1] * state.get(("v", k), 0.0) + (1 - betas[1]) * grads[k] ** 2
        m_hat, s_hat = m / (1 - betas[0] ** step), s / (1 - betas[1] ** step)
        new_params[k] = v * (1 - lr * weight_decay) - lr * m_hat / (jnp.sqrt(s_hat) + eps)
        new_state[("m", k)], new_state[("v", k)] = m, s
    return new_params, new_state


def main():
    parser = argparse.ArgumentParser(description="one training step of the planned model")
    parser.add_argument("--params", required=True, help=".npz of parameters (and buffers) by name")
    parser.add_argument("--batch", required=True, help=".npz of the inputs, arrays named x0, x1, ...")
    parser.add_argument("--grads", help="write the gradients (and the loss) to this .npz")
    parser.add_argument("--seed", type=int, default=0, help="the jax.random key the dropout masks are drawn from")
    parser.add_argument("--masks", help=".npz of the dropout masks by name (MASKS), instead of drawing them")
    args = parser.parse_args()
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize()
    params = dict(np.load(args.params))
    saved = np.load(args.batch)
    batch = [saved[f"x{i}"] for i in range(len(saved.files))]
    masks = dict(np.load(args.masks)) if args.masks else None
    loss, grads = train_step(params, batch, masks=masks, seed=args.seed)
    print(f"loss {float(loss):.8f}")
    if args.grads:
        np.savez(args.grads, __loss__=np.asarray(loss), **{k: np.asarray(v) for k, v in grads.items()})


if __name__ == "__main__":
    main()'''
