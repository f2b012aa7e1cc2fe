"""Code generators: a Plan as a per-rank torch program or a sharded JAX program.

Importing this package registers both with ``Plan.emit``. JAX is an optional dependency: its
code generator is imported when a JAX program is emitted, so autopar imports without it."""
from autopar.backends.torch.codegen import emit_torch
from autopar.backends.torch.stage_codegen import emit_torch_pipeline
from autopar.ir.plan import register_emitter


def _emit_torch(plan) -> str:
    return emit_torch(plan) if plan.pipeline is None else emit_torch_pipeline(plan)


def _emit_jax(plan) -> str:
    from autopar.backends.jax.codegen import emit_jax  # needs jax installed (pip install autopar[jax])

    return emit_jax(plan)


register_emitter("torch", _emit_torch)
register_emitter("jax", _emit_jax)
