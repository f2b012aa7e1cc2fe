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


def methods_between_graphs(cls, *names: str) -> None:
    """``cls``'s methods ``names`` as graph breaks under torch.compile (their statements run as
    Python), made once per class when its first instance is built: at class definition,
    torch.compiler.disable would load Dynamo on ``import autopar`` (half a second in every
    process, most of which never compile)."""
    if cls.__dict__.get("_methods_between_graphs"):
        return
    for name in names:
        setattr(cls, name, torch.compiler.disable(cls.__dict__[name], recursive=True))
    cls._methods_between_graphs = True
