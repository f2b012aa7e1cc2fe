"""torch.compile for the emitted programs, compiled once per host where ranks' graphs agree.

Every rank of a data- or tensor-parallel mesh traces the same program, so Inductor would lower
and build the same kernels on every rank of a host (eight times on an eight-GPU node). The
programs' graphs name process groups by rank-independent aliases (TracedCollectives), which
makes those graphs identical; the backend below then lets one rank at a time compile a given
graph, and the others find it in Inductor's on-disk caches (FX graph and AOTAutograd) instead
of compiling it again. Graphs that differ (pipeline stages) compile side by side.
"""
from __future__ import annotations

import hashlib
import os

import torch
from filelock import FileLock

# fallback_random: random ops draw from torch's generator, as the eager model does; Inductor's
# own bucketing coalesces the gradient syncs as RankMesh's buckets do (one collective per
# gradient costs a compiled dp step twice its uncompiled time on gloo)
COMPILE_OPTIONS = {"fallback_random": True, "bucket_all_reduces_fx": "all", "bucket_reduce_scatters_fx": "all"}


def compile_program(fn):
    """``fn`` through torch.compile with Inductor and COMPILE_OPTIONS, one rank of a host at a time per graph."""
    return torch.compile(fn, backend=_inductor_one_rank_at_a_time)


def _inductor_one_rank_at_a_time(gm: torch.fx.GraphModule, example_inputs):
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    with FileLock(os.path.join(cache_dir(), f"autopar-{_graph_key(gm, example_inputs)}.lock")):
        return compile_fx(gm, example_inputs, config_patches=COMPILE_OPTIONS)


def _graph_key(gm: torch.fx.GraphModule, example_inputs) -> str:
    described = [gm.code] + [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x)
                             for x in example_inputs]
    return hashlib.sha256(repr(described).encode()).hexdigest()[:24]
