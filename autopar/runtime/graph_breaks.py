"""Runtime kernels a compiled program calls as Python: the layers whose ranks communicate inside
them (expert parallelism's all-to-all, context parallelism's gathered attention)."""
from __future__ import annotations

import functools

import torch


def between_graphs(kernel):
    """A kernel a compiled program calls: a graph break, so the statements around it compile and
    the kernel runs as written (with split sizes known at run time only, say) on the rank's own
    mesh, the one behind a compiled program's functional collectives."""
    @functools.wraps(kernel)
    def eager(rt, *args, **kwargs):
        return kernel(getattr(rt, "rank_mesh", rt), *args, **kwargs)
    return torch.compiler.disable(eager, recursive=True)
