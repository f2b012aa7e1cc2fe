"""Where a mixed-precision gradient's partial sums are reduced (autopar.ir.precision).

Under autocast a weight gradient is computed in the low precision (a bf16 matmul, each rank's
partial sum over its block of the batch) and cast up to float32, the parameter's dtype. Its
partial sums may be reduced across ranks on either side of that cast:

- reduced in float32 (the default): not before the cast; the sum of the ranks' partial sums
  is then exact in float32, as FSDP2's ``reduce_dtype=torch.float32`` makes it;
- reduced in the compute dtype: not after the cast, but in the gradient's sync into its
  parameter's layout, which then moves the gradient cast back down (half the bytes), as
  FSDP2's ``reduce_dtype=torch.bfloat16`` does. The sync keeps its overlap with backward.

The sharding solve forbids a reduction on the edges the policy rules out
(``partial_sums_to_keep``), and prices and emits the syncs of
``gradients_to_reduce_on_the_wire`` in the compute dtype.
"""
from __future__ import annotations

import torch

from autopar.ir.precision import LOW_PRECISION, MixedPrecision
from autopar.ir.program import Program, tensor_inputs

aten = torch.ops.aten

# ops a gradient passes through, unchanged but for layout, dtype or a sum of its parts, on its
# way out of backward
_GRADIENT_PASSTHROUGH = frozenset({
    aten._to_copy.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.clone.default, aten.squeeze.dim, aten.unsqueeze.default,
    aten.add.Tensor, aten.detach.default,
})


def partial_sums_to_keep(program: Program, meta: dict, precision: MixedPrecision | None) -> frozenset:
    """(source, destination) edges on which a gradient's partial sums must stay partial: the
    low-precision edges before its cast up when reduced in float32, the float32 ones after it
    when reduced in the compute dtype (then its sync reduces it)."""
    if precision is None:
        return frozenset()
    return frozenset((src, dst) for chain in _mixed_gradient_chains(program, meta).values()
                     for src, dst, dtype in chain if (dtype in LOW_PRECISION) == precision.reduces_in_float32)


def gradients_to_reduce_on_the_wire(program: Program, meta: dict, precision: MixedPrecision | None) -> list[str]:
    """The gradients whose syncs move them in the compute dtype."""
    if precision is None or precision.reduces_in_float32:
        return []
    return list(_mixed_gradient_chains(program, meta))


def _mixed_gradient_chains(program: Program, meta: dict) -> dict[str, list]:
    """gradient -> its chain, for the gradients computed in low precision (a LayerNorm's,
    computed in float32, are not)."""
    chains = {grad: _gradient_chain(program, meta, grad) for grad in program.grads}
    return {grad: chain for grad, chain in chains.items() if any(dtype in LOW_PRECISION for *_, dtype in chain)}


def _gradient_chain(program: Program, meta: dict, grad: str) -> list[tuple[str, str, str]]:
    """(source, destination, dtype) of the edges a gradient passes through on its way out of
    backward, from the ops that compute its partial sums (a weight-gradient matmul)."""
    chain, seen, stack = [], set(), [grad]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = program.node(name)
        if node.op != "call_function" or node.target not in _GRADIENT_PASSTHROUGH:
            continue  # the op that computes: the chain starts there
        for arg in tensor_inputs(node):
            if meta[arg.name][0] is not None:
                chain.append((arg.name, name, meta[arg.name][0].dtype))
                stack.append(arg.name)
    return chain
