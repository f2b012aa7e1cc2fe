"""ATen ops in JAX, one function per op with ATen's signature, so the JAX program calls them
with the same arguments the torch program passes (printed by autopar.backends.printer).

Each runs on one rank's local block, as the ATen op does in the torch program. The emitted
program carries the source of the functions it calls, so it needs JAX and nothing of autopar:
a translation uses only ``jax``, ``jnp``, ``lax``, ``math`` and the functions of these modules.
"""
from autopar.backends.jax.aten.table import TABLE, helpers_of

__all__ = ["TABLE", "helpers_of"]
