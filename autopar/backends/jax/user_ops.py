"""JAX translations of the user's own ops (``autopar.register_jax_translation``), beside the
built-in table (autopar.backends.jax.aten). Kept free of JAX imports: registering one must not
need JAX until a JAX program is emitted."""
from __future__ import annotations

import inspect
import types

# the op's name as the graph records it ("namespace::op" overload printed as "namespace.op.overload") -> function
USER_TRANSLATIONS: dict = {}


def register_jax_translation(op, function) -> None:
    """Translate ``op`` (an ``OpOverload``, e.g. ``torch.ops.mylib.scaled_silu.default``) to JAX
    with ``function``, which takes the op's arguments as the graph passes them (tensors as JAX
    arrays) and returns what the op returns. The emitted module carries ``function``'s source, so
    it must be a plain ``def`` at module level that uses only ``jax``, ``jnp``, ``lax`` and
    ``math``."""
    if not isinstance(function, types.FunctionType) or function.__name__ == "<lambda>":
        raise TypeError(f"a JAX translation must be a function defined with def, got {function!r}")
    if function.__closure__ or "." in function.__qualname__:
        raise ValueError(f"the JAX translation {function.__qualname__} is nested in another function or class: the "
                         f"emitted module carries its source alone, so define it at module level")
    try:
        inspect.getsource(function)
    except (OSError, TypeError) as e:
        raise ValueError(f"the source of {function.__name__} cannot be read ({e}): the emitted module carries it, "
                         f"so define it in a .py file") from e
    if function.__name__.startswith("aten_"):
        raise ValueError(f"{function.__name__}: names starting with aten_ are the built-in translations'; rename it")
    USER_TRANSLATIONS[str(op)] = function
