"""Code generators: a Plan as a per-rank torch program or a sharded JAX program.

Importing this package registers both with ``Plan.emit``."""
from autopar.backends.jax.codegen import emit_jax
from autopar.backends.torch.codegen import emit_torch
from autopar.ir.plan import register_emitter

register_emitter("torch", emit_torch)
register_emitter("jax", emit_jax)
