"""What emitted programs call: this rank's place on the mesh and its collectives.

Collectives return new tensors and never change their input, because a value
may still be read in its old layout by another consumer; the exception is an all-reduce (or
reduce-scatter) the program marks as its input's last read, which runs in the input's memory
where no other tensor shares it. On gloo, which lacks
reduce-scatter and all-to-all on CPU tensors, those two are composed from
all-reduce/all-gather plus a local slice (same result, more traffic).

Gradient syncs (``start_*``, which the program waits for at the end of backward) go out in
buckets, as DDP's reducer sends them: each all-reduce joins the open bucket of its axis and
dtype, which is sent as one collective once it holds ``bucket_bytes`` or when the program
first waits for a sync (every rank starts the same syncs in the same order, so every rank
forms the same buckets). They run on process groups of their own. ``start_all_gather`` is a
parameter gather the program starts a layer ahead of its use (ZeRO-3 prefetch).
"""
from __future__ import annotations

import atexit
import datetime
import gc
import os
import traceback
from collections import Counter

import torch
import torch.distributed as dist

from autopar.errors import AutoparError, CollectiveTimeoutError, PlanMismatchError
from autopar.ir.hardware import GRADIENT_BUCKET_BYTES
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Partial, Shard, Spec
from autopar.ir.redistribute import plan_steps

TIMEOUT_VARIABLE = "AUTOPAR_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0  # torch.distributed's own default for a process group
_AGREEMENT_BYTES = 64  # what each rank states when ranks check they agree


def collective_timeout_s() -> float:
    """How long a collective may take before it is an error: ``$AUTOPAR_COLLECTIVE_TIMEOUT_S``
    seconds, else torch.distributed's default."""
    text = os.environ.get(TIMEOUT_VARIABLE)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise AutoparError(f"{TIMEOUT_VARIABLE}={text!r}: give the collective timeout in seconds, a positive number")
    return seconds


class RankMesh:
    def __init__(self, mesh: Mesh, rank: int | None = None, device: torch.device | str = "cpu",
                 bucket_bytes: float = GRADIENT_BUCKET_BYTES, pipeline_stages: int = 1,
                 timeout_s: float | None = None):
        """``pipeline_stages`` > 1: the world is that many copies of ``mesh``, one per pipeline
        rank (the mesh ``pp`` x ``mesh``, pp first); this rank's collectives run within its
        own copy, and ``pipeline_group`` joins it with the ranks of the same place in the others.
        ``timeout_s``: a collective that has not completed after so long raises
        CollectiveTimeoutError (default: collective_timeout_s())."""
        if not dist.is_initialized():
            raise RuntimeError("RankMesh needs an initialised process group (torchrun or autopar.check)")
        whole = mesh if pipeline_stages == 1 else Mesh(("pp",) + mesh.axis_names, (pipeline_stages,) + mesh.shape)
        whole.check_world_size(dist.get_world_size())
        offset = whole.ndim - mesh.ndim  # the pp axis, where there is one
        self.mesh = mesh
        self.whole = whole  # the world's mesh: ``mesh``, or pp x ``mesh``
        self.rank = dist.get_rank() if rank is None else rank
        self.coords = whole.coords(self.rank)[offset:]
        self.pipeline_rank = whole.coords(self.rank)[0] if offset else 0
        self.device = torch.device(device)
        self.timeout_s = collective_timeout_s() if timeout_s is None else timeout_s
        # every rank makes the mesh's process groups together: ranks building other meshes would
        # make groups that do not match, and hang whatever runs on them next
        agree_across_world("the mesh they build process groups for", str(whole), self.device, self.timeout_s)
        full, self.sync_groups = _process_groups(self.device.type, whole, mesh.axis_names)
        self.device_mesh = full[mesh.axis_names] if offset else full
        self.groups = {name: full.get_group(name) for name in mesh.axis_names}
        self.pipeline_group = full.get_group("pp") if offset else None
        self._gloo = dist.get_backend() == "gloo"
        self.bytes_moved: Counter = Counter()  # collective kind -> message bytes, as the cost model counts them
        self.calls: Counter = Counter()  # collective kind (or "gradient bucket") -> calls made to the library
        self.bucket_bytes = bucket_bytes
        self._buckets: dict[tuple, _Bucket] = {}  # (axis, dtype) -> the gradient syncs not sent yet
        self._bucket_buffers: dict[tuple, list[torch.Tensor]] = {}  # (elements, dtype) -> flat buffers
        self.given_masks = None  # a pipeline stage's dropout masks for the forward it runs (native_dropout)

    def coords_of(self, rank: int) -> tuple[int, ...]:
        """Where global rank ``rank`` sits on its copy of ``mesh`` (its stage's, in a pipeline)."""
        return self.whole.coords(rank)[self.whole.ndim - self.mesh.ndim:]

    def _axis(self, name: str) -> tuple[int, int, object]:
        axis = self.mesh.axis_names.index(name)
        return self.coords[axis], self.mesh.shape[axis], self.groups[name]

    # Each collective counts the message the plan asked for (the cost model's n), even where
    # gloo composes it from other calls, so counted and predicted bytes compare one to one.
    # ``last_read``: the program reads ``x`` no more, so where no other tensor shares its memory
    # either, it is reduced in place instead of in a copy
    def all_reduce(self, x: torch.Tensor, axis: str, last_read: bool = False) -> torch.Tensor:
        self.bytes_moved["all_reduce"] += x.numel() * x.element_size()
        return self._start_all_reduce(x, self.groups[axis], in_place=last_read and _alone(x), axis=axis).wait()

    def all_gather(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        return self.start_all_gather(x, axis, dim).wait()

    def reduce_scatter(self, x: torch.Tensor, axis: str, dim: int, last_read: bool = False) -> torch.Tensor:
        return self._start_reduce_scatter(x, axis, dim, self.groups[axis], in_place=last_read and _alone(x)).wait()

    def all_to_all(self, x: torch.Tensor, axis: str, src_dim: int, dst_dim: int) -> torch.Tensor:
        coord, p, group = self._axis(axis)
        self.bytes_moved["all_to_all"] += x.numel() * x.element_size()
        if self._gloo:  # gloo has no all_to_all
            return self.shard(self._all_gather(x, axis, src_dim), axis, dst_dim)
        sends = [c.contiguous() for c in x.chunk(p, dst_dim)]
        recvs = [torch.empty_like(sends[0]) for _ in range(p)]
        self.calls["all_to_all"] += 1
        work = dist.all_to_all(recvs, sends, group=group, async_op=True)
        return Pending(work, None, lambda _: torch.cat(recvs, dim=src_dim), what=("all_to_all", axis),
                       timeout_s=self.timeout_s).wait()

    def exchange_rows(self, x: torch.Tensor, axis: str, send: list[int], receive: list[int]) -> torch.Tensor:
        """Uneven all-to-all along dim 0: the first ``send[0]`` rows of ``x`` go to the axis's
        rank 0, the next ``send[1]`` to rank 1, ...; ``receive[j]`` rows come from rank j, in
        rank order. Sizes known at run time only (expert parallelism's routed tokens)."""
        out = x.new_empty((sum(receive),) + tuple(x.shape[1:]))
        self.bytes_moved["all_to_all"] += x.numel() * x.element_size()
        self.calls["all_to_all"] += 1
        work = dist.all_to_all_single(out, x.contiguous(), receive, send, group=self.groups[axis], async_op=True)
        return Pending(work, out, what=("all_to_all", axis), timeout_s=self.timeout_s).wait()

    # Asynchronous forms, for gradient syncs (on their own groups): the program goes on computing
    # and calls .wait() at the end.
    def start_all_reduce(self, x: torch.Tensor, axis: str) -> Pending:
        self.bytes_moved["all_reduce"] += x.numel() * x.element_size()
        return self._join_bucket(x, axis)

    def start_all_gather(self, x: torch.Tensor, axis: str, dim: int) -> Pending:
        """A parameter's gather started a layer ahead (ZeRO-3 prefetch), on the axis's own group
        in program order: every rank starts the same gathers in the same order."""
        self.bytes_moved["all_gather"] += x.numel() * x.element_size() * self._axis(axis)[1]
        return self._start_all_gather(x, axis, dim)

    def start_reduce_scatter(self, x: torch.Tensor, axis: str, dim: int) -> Pending:
        if self._gloo:  # composed from an all-reduce, which joins a bucket
            self.bytes_moved["reduce_scatter"] += x.numel() * x.element_size()
            return self._join_bucket(x, axis, then=lambda t: self.shard(t, axis, dim))
        return self._start_reduce_scatter(x, axis, dim, self.sync_groups[axis])

    @staticmethod
    def wait(pending: Pending) -> torch.Tensor:
        """A started collective's result: a gradient sync's, or a prefetched parameter gather's
        (the program calls ``rt.wait``, which a compiled program's runtime answers without a handle)."""
        return pending.wait()

    def _join_bucket(self, x: torch.Tensor, axis: str, then=None) -> Pending:
        key = (axis, x.dtype)
        bucket = self._buckets.setdefault(key, _Bucket())
        pending = Pending(None, None, then, send=self.send_buckets, what=("gradient all_reduce", axis),
                          timeout_s=self.timeout_s)
        bucket.add(x, pending)
        if bucket.nbytes >= self.bucket_bytes:
            self._send(self._buckets.pop(key), axis)
        return pending

    def send_buckets(self) -> None:
        """Send every open bucket (in the order they were opened: the same on every rank)."""
        buckets, self._buckets = self._buckets, {}
        for (axis, _), bucket in buckets.items():
            self._send(bucket, axis)

    def _send(self, bucket: _Bucket, axis: str) -> None:
        # a copy into the bucket's buffer: the gradients stay as they were
        flat = torch.cat([x.reshape(-1) for x in bucket.tensors], out=self._bucket_buffer(bucket))
        self.calls["gradient bucket"] += 1
        work = dist.all_reduce(flat, group=self.sync_groups[axis], async_op=True)
        offset = 0
        for x, pending in zip(bucket.tensors, bucket.pendings):
            pending.work, pending.out = work, flat[offset:offset + x.numel()].view(x.shape)
            offset += x.numel()

    def _bucket_buffer(self, bucket: _Bucket) -> torch.Tensor:
        """A flat buffer for ``bucket``. On gloo (CPU processes) one is kept for the next step and
        reused where no tensor shares its memory any more (no gradient handed out from it is
        alive, in ``.grad`` say), as DDP keeps its buckets: allocating tens of MB anew costs its
        page faults on every step, four times the copy into it (autopar.lowering.memory does not
        count them yet: a step after the first holds their bytes through forward). On an
        accelerator the caching allocator hands freed memory out again at no such cost, and a
        kept buffer would hold the gradients' bytes through the next forward."""
        numel, dtype = sum(x.numel() for x in bucket.tensors), bucket.tensors[0].dtype
        if not self._gloo:
            return torch.empty(numel, dtype=dtype, device=self.device)
        buffers = self._bucket_buffers.setdefault((numel, dtype), [])
        free = next((b for b in buffers if _tensors_sharing_memory(b) == 1), None)
        if free is None:
            free = torch.empty(numel, dtype=dtype, device=self.device)
            buffers.append(free)
        return free

    def _start_reduce_scatter(self, x: torch.Tensor, axis: str, dim: int, group, in_place: bool = False) -> Pending:
        coord, p, _ = self._axis(axis)
        self.bytes_moved["reduce_scatter"] += x.numel() * x.element_size()
        what = ("reduce_scatter", axis)
        if self._gloo:  # gloo has no reduce_scatter: all-reduce, then keep this rank's block
            pending = self._start_all_reduce(x, group, in_place, axis)
            return Pending(pending.work, pending.out, lambda t: self.shard(t, axis, dim), what=what,
                           timeout_s=self.timeout_s)
        parts = [c.contiguous() for c in x.chunk(p, dim)]
        out = torch.empty_like(parts[coord])
        self.calls["reduce_scatter"] += 1
        return Pending(dist.reduce_scatter(out, parts, group=group, async_op=True), out, what=what,
                       timeout_s=self.timeout_s)

    def _start_all_reduce(self, x: torch.Tensor, group, in_place: bool = False, axis: str = "") -> Pending:
        out = x if in_place else x.detach().clone()
        self.calls["all_reduce"] += 1
        return Pending(dist.all_reduce(out, group=group, async_op=True), out, what=("all_reduce", axis),
                       timeout_s=self.timeout_s)

    def _all_gather(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        return self._start_all_gather(x, axis, dim).wait()

    def _start_all_gather(self, x: torch.Tensor, axis: str, dim: int) -> Pending:
        _, p, group = self._axis(axis)
        x = x.contiguous()
        self.calls["all_gather"] += 1
        what = ("all_gather", axis)
        if dim == 0 and not self._gloo:  # NCCL fills one buffer: no per-rank parts to concatenate
            out = x.new_empty((p * x.shape[0],) + tuple(x.shape[1:]))
            return Pending(dist.all_gather_into_tensor(out, x, group=group, async_op=True), out, what=what,
                           timeout_s=self.timeout_s)
        parts = [torch.empty_like(x) for _ in range(p)]
        return Pending(dist.all_gather(parts, x, group=group, async_op=True), None, lambda _: torch.cat(parts, dim=dim),
                       what=what, timeout_s=self.timeout_s)

    def shard(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        """This rank's block, copied: a view would keep the whole tensor's storage alive."""
        coord, p, _ = self._axis(axis)
        return x.chunk(p, dim)[coord].clone(memory_format=torch.contiguous_format)

    def zero_partial(self, x: torch.Tensor, axis: str) -> torch.Tensor:
        """Replicate -> Partial: one rank keeps the value, the others hold zeros, so the sum is unchanged."""
        coord, _, _ = self._axis(axis)
        # a new tensor object even where it holds x's values: an all_reduce of the result in place
        # must see that x shares its memory (_alone)
        return x.detach() if coord == 0 else torch.zeros_like(x)

    def redistribute(self, x: torch.Tensor, src: Spec, dst: Spec) -> torch.Tensor:
        """``x``, this rank's block of a tensor in layout ``src``, as its block in layout ``dst``
        (the steps autopar.ir.redistribute plans, as an emitted program runs them)."""
        for step in plan_steps(src, dst):
            axis = self.mesh.axis_names[step.axis]
            if step.kind in ("all_reduce", "zero_partial"):
                x = getattr(self, step.kind)(x, axis)
            elif step.kind == "all_to_all":
                x = self.all_to_all(x, axis, src_dim=step.src_dim, dst_dim=step.dim)
            else:
                x = getattr(self, step.kind)(x, axis, dim=step.dim)
        return x

    def agree(self, what: str, value: str) -> None:
        """Every rank of the world states ``value`` for ``what``: see agree_across_world."""
        agree_across_world(what, value, self.device, self.timeout_s)

    def native_dropout(self, x: torch.Tensor, p: float, train, global_shape, spec: str):
        """Dropout whose mask matches a single process's: every rank draws the global mask from the
        same random state (the caller seeds all ranks alike), then keeps its own block. A
        pipeline's stage hands the masks of its micro-batch in ``given_masks``, in its dropouts'
        order (autopar.runtime.microbatch_dropout: None where it draws its own)."""
        if not train:
            return torch.ops.aten.native_dropout.default(x, p, train)
        given = next(self.given_masks) if self.given_masks is not None else None
        whole = given if given is not None else global_dropout_mask(global_shape, x.dtype, p, x.device)
        mask = local_shard(whole, Spec.from_json(spec), self.mesh, self.coords)
        scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
        return x.mul(mask).mul_(scale), mask


def agree_across_world(what: str, value: str, device: torch.device, timeout_s: float) -> None:
    """Every rank of the world states ``value`` for ``what`` (a mesh, a plan's hash, a program's
    signature): where they differ, every rank raises PlanMismatchError naming which ranks hold
    which, and where a rank never states it (it stopped, or skipped the step), the others raise
    CollectiveTimeoutError: never a hang."""
    data = value.encode()[:_AGREEMENT_BYTES]
    mine = torch.zeros(_AGREEMENT_BYTES, dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    work = dist.all_gather(parts, mine, async_op=True)
    Pending(work, None, what=(f"the ranks' check that they agree on {what}", "<world>"), timeout_s=timeout_s).wait()
    values = [bytes(p.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for p in parts]
    if len(set(values)) > 1:
        held: dict = {}
        for rank, v in enumerate(values):
            held.setdefault(v, []).append(rank)
        raise PlanMismatchError(f"the ranks disagree on {what}: " + "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {v}" for v, ranks in held.items())
            + ". Every rank must load the same plan and call the model with the same inputs' shapes")


def _alone(x: torch.Tensor) -> bool:
    """``x`` may be written in place: contiguous, and no other tensor shares its memory."""
    return x.is_contiguous() and _tensors_sharing_memory(x) == 1


def _tensors_sharing_memory(x: torch.Tensor) -> int:
    """How many tensors hold ``x``'s storage, ``x`` included (a view, a detached alias and a
    DTensor's local tensor each count: a tensor's own use count would miss the last two)."""
    storage = x.untyped_storage()
    return torch._C._storage_Use_Count(storage._cdata) - 1  # less the storage object made here


class _SharedGroups:
    """(device type, world mesh) -> (DeviceMesh, {axis name: gradient-sync group}), for the
    process group they were made in. Every RankMesh of a process shares them: each process
    group holds its own threads and sockets until the process ends (torch offers no way to
    destroy a subgroup alone), so a process that builds many modules (a worker pool, a notebook)
    would otherwise gather hundreds of them."""

    def __init__(self):
        self.world = None  # the default process group the groups below belong to
        self.meshes: dict = {}
        self.release_registered = False

    def of(self, device_type: str, whole: Mesh) -> tuple:
        if self.world is not dist.group.WORLD:  # a new process group: the old one's groups are gone with it
            self.meshes.clear()
            self.world = dist.group.WORLD
        if not self.release_registered:
            atexit.register(self.release)
            self.release_registered = True
        if (device_type, whole) not in self.meshes:
            from torch.distributed.device_mesh import init_device_mesh

            self.meshes[device_type, whole] = (init_device_mesh(device_type, whole.shape,
                                                                mesh_dim_names=whole.axis_names), {})
        return self.meshes[device_type, whole]

    def release(self) -> None:
        """At exit, while the interpreter still runs: drop the groups, and collect the modules
        that are garbage by now, so that every group no live object holds is destroyed here, its
        gloo threads joined. Destroyed during the interpreter's finalization instead, a gloo
        thread still freeing a finished collective's tensor would take the GIL there and abort
        the process ("terminate called without an active exception", after all its output;
        pytorch PR 179291 describes it); destroy_process_group does not join a group's threads
        while anything holds the group."""
        self.meshes.clear()
        self.world = None
        gc.collect()


_SHARED = _SharedGroups()


def _process_groups(device_type: str, whole: Mesh, synced: tuple[str, ...]) -> tuple:
    """(the DeviceMesh over the world's mesh ``whole``, {axis: its gradient-sync group} for the
    ``synced`` axes), made once per process group. Gradient syncs run on groups of their own:
    gloo and NCCL run one group's collectives in the order they were issued, so a synchronous
    collective later in backward (an all-gather) would otherwise wait behind every sync queued
    before it (every rank makes every group, its own copy's and the others', in the same order)."""
    full, sync = _SHARED.of(device_type, whole)
    for name in synced:
        if name not in sync:
            sync[name] = _new_group_along(full.mesh, whole.axis_names.index(name))
    return full, {name: sync[name] for name in synced}


def _new_group_along(ranks: torch.Tensor, axis: int):
    """This rank's new process group among the ranks that differ only in ``axis`` of the mesh
    ``ranks`` (a new one even where the mesh's own would be the world group)."""
    along = ranks.movedim(axis, -1).reshape(-1, ranks.shape[axis]).tolist()
    mine, _ = dist.new_subgroups_by_enumeration(along)
    return mine


class _Bucket:
    def __init__(self):
        self.tensors: list[torch.Tensor] = []
        self.pendings: list[Pending] = []
        self.nbytes = 0

    def add(self, x: torch.Tensor, pending: Pending) -> None:
        self.tensors.append(x)
        self.pendings.append(pending)
        self.nbytes += x.numel() * x.element_size()


WAIT_EVENT = "autopar::wait"  # a collective's wait, as torch.profiler records it


class Pending:
    """A collective in flight, or a gradient sync in a bucket not sent yet (``send`` sends it);
    ``wait()`` returns its result (after ``then``, a local finishing step), or raises
    CollectiveTimeoutError once ``timeout_s`` has passed, naming ``what`` ((collective, mesh
    axis)) and the statement of the emitted program that waits for it."""

    def __init__(self, work, out: torch.Tensor | None, then=None, send=None, what=("collective", ""),
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.work, self.out, self.then, self.send = work, out, then, send
        self.what, self.timeout_s = what, timeout_s

    def wait(self) -> torch.Tensor:
        if self.work is None:
            self.send()
        try:
            # named in torch.profiler's traces (autopar.profile counts it with the collectives)
            with torch.profiler.record_function(f"{WAIT_EVENT} {self.what[0]}"):
                self.work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                raise
            raise CollectiveTimeoutError(_timeout_message(*self.what, self.timeout_s)) from exc
        return self.then(self.out) if self.then else self.out


def _timeout_message(kind: str, axis: str, seconds: float) -> str:
    where = program_statement()
    return (f"{kind} over mesh axis {axis!r} did not complete within {seconds:g} s"
            f"{f' at {where}' if where else ''}: another rank is not running this step (it stopped, skipped a "
            f"step, or runs another plan or other input shapes); set {TIMEOUT_VARIABLE} to wait longer")


def program_statement() -> str | None:
    """``<program>:<line>: <statement>`` of the innermost emitted program on the stack, if any."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith("<autopar_"):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return None


def global_dropout_mask(shape, dtype: torch.dtype, p: float, device=None) -> torch.Tensor:
    """The mask single-process torch's dropout draws next for a tensor of ``shape``: every rank
    (and autopar.check's JAX run) draws it whole from the same random state."""
    return torch.ops.aten.native_dropout.default(torch.empty(shape, dtype=dtype, device=device), p, True)[1]


def local_shard(x: torch.Tensor, spec: Spec, mesh: Mesh, coords: tuple[int, ...]) -> torch.Tensor:
    """This rank's block of a global tensor (a copy, so the global storage can be freed)."""
    block = x
    for axis, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            block = block.chunk(mesh.shape[axis], p.dim)[coords[axis]]
        elif isinstance(p, Partial):
            raise ValueError("a global tensor has no partial layout to take a block of")
    return block.contiguous() if block is x else block.clone(memory_format=torch.contiguous_format)
