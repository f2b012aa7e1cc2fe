"""Jobs run on every rank of a local gloo group by tests (importable by workers)."""
import dataclasses
import os
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

import autopar

# links so fast that the planner shards: the test then runs real collectives
FAST = dataclasses.replace(autopar.PRESETS["h100-sxm"], name="fast", intra_node=autopar.Link(450e12, 1e-9),
                           inter_node=autopar.Link(450e12, 1e-9), kernel_floor_s=0.0, half_efficiency_flops=0.0,
                           collectives_library="gloo")


@autopar.autoparallelize(mesh={"dp": 2, "tp": 2}, hardware=FAST)
class DecoratedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 128)
        self.fc2 = nn.Linear(128, 32)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)


def train_decorated(rank, world_size, steps):
    torch.manual_seed(rank)  # different init per rank: rank 0's weights must be broadcast
    model = DecoratedMLP()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 32, generator=g), torch.randn(8, 32, generator=g)
    autopar.prepare(model, x, y)  # plans and shards: the optimizer takes the sharded parameters
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    plan = autopar.plan_of(model)
    sharded = sum(not plan.out_spec(ph).is_replicated() for ph in plan.graph.params)
    return {"losses": losses, "plan": plan.hash, "sharded_params": sharded,
            "local_shapes": [tuple(p.to_local().shape) for p in model.parameters()],
            "global_shapes": [tuple(p.shape) for p in model.parameters()]}


def train_decorated_in_micro_batches(rank, world_size, steps):
    """As train_decorated, each step's batch of 8 in two micro-batches, the first under no_sync()."""
    torch.manual_seed(rank)
    model = DecoratedMLP()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 32, generator=g), torch.randn(8, 32, generator=g)
    autopar.prepare(model, x[:4], y[:4])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with model.no_sync():
            first = model(x[:4], y[:4]) / 2
        first.backward()
        second = model(x[4:], y[4:]) / 2
        second.backward()
        opt.step()
        losses.append(first.item() + second.item())
    return {"losses": losses}


def wrap_instance_with_wrong_mesh(rank, world_size):
    model = autopar.autoparallelize(nn.Linear(4, 4), mesh="dp=4")
    try:
        model(torch.randn(2, 4))
    except autopar.MeshError as exc:
        return {"error": str(exc), "planned": autopar.plan_of(model) is not None}
    return {"error": None}


def die(rank, world_size):
    """A job that kills its worker process, as a crash in native code would."""
    import os

    os._exit(3)


def crash_in_native_code(rank, world_size):
    """A job whose worker reads address 0 (SIGSEGV), from a function named to be found in the stack."""
    import ctypes

    ctypes.string_at(0)


def prints_native_crashes(rank, world_size) -> bool:
    import faulthandler

    return faulthandler.is_enabled()


def raise_on_rank_0_while_rank_1_waits(rank, world_size):
    import torch.distributed as dist

    if rank == 0:
        raise ValueError("rank 0 gives up")
    dist.barrier()  # never completes: rank 0 is not coming


def forward_then_backward(rank, world_size, plan_json, inputs):
    """The split programs on one rank: what calling the module and ``loss.backward()`` each run."""
    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule
    from examples import mlp

    model, _ = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.Plan.from_json(plan_json)
    rt = rank_mesh_for(plan.mesh)
    parallel = ParallelModule(model, plan, rt, plan.emit("torch"))
    rt.bytes_moved.clear()
    loss = parallel(*inputs)
    forward_bytes, grads_after_forward = sum(rt.bytes_moved.values()), [p.grad for p in model.parameters()]
    loss.backward()
    step_bytes = sum(rt.bytes_moved.values())
    try:
        loss.backward()
        second = None
    except RuntimeError as exc:
        second = str(exc)
    rt.bytes_moved.clear()
    with torch.no_grad():
        no_grad_loss = parallel(*inputs)
    return {"loss": loss.item(), "forward_bytes": forward_bytes, "step_bytes": step_bytes,
            "grads_after_forward": grads_after_forward, "second_backward": second,
            "no_grad_loss": no_grad_loss.item(), "no_grad_requires_grad": no_grad_loss.requires_grad,
            "no_grad_bytes": sum(rt.bytes_moved.values())}


def call_with_other_batch(rank, world_size, plan_json, inputs):
    """A plan of batch 8 called with batch 4: refused, naming both shapes."""
    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule
    from examples import mlp

    model, _ = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.Plan.from_json(plan_json)
    parallel = ParallelModule(model, plan, rank_mesh_for(plan.mesh), plan.emit("torch"))
    try:
        return {"loss": parallel(*inputs).item(), "error": None}
    except autopar.PlanMismatchError as exc:
        return {"error": str(exc)}


def call_in_eval_mode(rank, world_size, plan_json, inputs):
    """A plan captured in training mode, called after model.eval(): refused."""
    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule
    from examples import mlp

    model, _ = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.Plan.from_json(plan_json)
    parallel = ParallelModule(model, plan, rank_mesh_for(plan.mesh), plan.emit("torch"))
    parallel.eval()
    try:
        parallel(*inputs)
        return {"error": None}
    except autopar.AutoparError as exc:
        return {"error": str(exc)}


def accumulate_micro_batches(rank, world_size, plan_json, micro_batches, defer):
    """Gradient accumulation over ``micro_batches``: all but the last under no_sync() when ``defer``."""
    import contextlib

    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule
    from examples import mlp

    model, _ = mlp.make(batch=4, width=64, hidden=128)
    plan = autopar.Plan.from_json(plan_json)
    rt = rank_mesh_for(plan.mesh)
    parallel = ParallelModule(model, plan, rt, plan.emit("torch"))
    rt.bytes_moved.clear()
    losses = []
    for k, batch in enumerate(micro_batches):
        deferred = defer and k < len(micro_batches) - 1
        with parallel.no_sync() if deferred else contextlib.nullcontext():
            loss = parallel(*batch) / len(micro_batches)
        loss.backward()
        losses.append(loss.item())
    return {"losses": losses, "bytes": sum(rt.bytes_moved.values()), "coords": rt.coords,
            "grads": {n: p.grad.to_local().clone() for n, p in model.named_parameters()},
            "unsynced": len(parallel.unsynced)}


def play(model, script, lr=0.1):
    """Run ``script`` on ``model``: each entry ``(what, args, kwargs)`` is "train" (an SGD step
    on the call's loss), "train_in_eval" (the same in evaluation mode), "no_grad" (a call under
    torch.no_grad()), "eval" (the call under no_grad in evaluation mode, then back to training
    mode) or "requires_grad" (``args``: a parameter's name and the flag to set; no call). Per
    call: the output's type and every tensor in it, whole (a DTensor gathered), by its place in
    the output."""
    from autopar.capture.export import find_loss
    from autopar.check import output_values

    # built right after wrapping, as training scripts do: the first call shards an autoparallelized
    # model's parameters, and the optimizer then holds the sharded ones
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    results = []
    for i, (what, args, kwargs) in enumerate(script):
        torch.manual_seed(100 + i)  # dropout draws alike on every rank and in eager
        if what == "requires_grad":
            model.get_parameter(args[0]).requires_grad_(args[1])
            continue
        if what in ("train", "train_in_eval"):
            if what == "train_in_eval":
                model.eval()
            output = model(*args, **kwargs)
            find_loss(output).backward()
            opt.step()
            opt.zero_grad()
            if what == "train_in_eval":
                model.train()
        else:
            model.train(what != "eval")
            with torch.no_grad():
                output = model(*args, **kwargs)
            model.train()
        results.append({"type": type(output).__name__, "tensors": output_values(output)})
    return results


def play_autoparallelized(rank, world_size, model_bytes, script, mesh, options):
    """``play`` on the model made by autopar.autoparallelize; also its buffers, whole, the
    programs it planned ((kind, training mode) of each) and the warnings given (message, file).
    An AutoparError ends the script and is returned as ``error``."""
    import io
    import warnings

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    wrapped = autopar.autoparallelize(model, mesh=mesh, hardware=FAST, **options)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            results = play(wrapped, script)
    except autopar.AutoparError as exc:
        return {"error": str(exc)}
    parallel = autopar.parallelize.parallel_module(wrapped)
    buffers = {fqn: buffer.full_tensor() for fqn, buffer in model.named_buffers()}
    programs = sorted((p.plan.graph.kind, p.plan.graph.training) for p in parallel.programs.values())
    return {"results": results, "buffers": buffers, "programs": programs,
            "warnings": [(str(w.message), w.filename) for w in warned], "error": None}


def synchronous_collective_while_a_gradient_sync_waits(rank, world_size):
    """Rank 0 starts a gradient sync that rank 1 joins only after an all-gather: the all-gather
    must not queue behind the sync (on one group, gloo would pair rank 0's all-reduce with
    rank 1's all-gather)."""
    from autopar.check import rank_mesh_for

    rt = rank_mesh_for(autopar.Mesh.of(dp=2))
    grad = torch.full((4,), float(rank + 1))
    pending = rt.start_all_reduce(grad, "dp") if rank == 0 else None
    gathered = rt.all_gather(torch.tensor([rank]), "dp", 0)
    if rank == 1:
        pending = rt.start_all_reduce(grad, "dp")
    return gathered.tolist(), pending.wait().tolist()


def process_groups_of_rank_meshes(rank, world_size):
    """Three RankMeshes, two of one mesh: the same mesh's share their process groups and
    threads (a pool process builds hundreds of modules), another mesh gets its own."""
    import threading

    from autopar.runtime.rank_mesh import RankMesh

    first = RankMesh(autopar.Mesh.of(dp=2))
    threads = threading.active_count(), len(os.listdir("/proc/self/task"))
    again = RankMesh(autopar.Mesh.of(dp=2))
    same = (again.groups["dp"] is first.groups["dp"] and again.sync_groups["dp"] is first.sync_groups["dp"]
            and again.device_mesh is first.device_mesh)
    unchanged = (threading.active_count(), len(os.listdir("/proc/self/task"))) == threads
    other = RankMesh(autopar.Mesh.of(tp=2))
    distinct = other.sync_groups["tp"] is not first.sync_groups["dp"]
    summed = other.all_reduce(torch.tensor([rank + 1.0]), "tp").item()
    return {"same": same, "threads unchanged": unchanged, "distinct": distinct, "summed": summed}


def an_autoparallelized_model_once_dropped(rank, world_size):
    """Whether an autoparallelized model that has trained a step, and that nothing holds any
    more, is collected (its runner holds it: a table keyed by the model kept both alive)."""
    import gc
    import weakref

    from examples import mlp

    plain, inputs = mlp.make(batch=4, width=32, hidden=64)
    model = autopar.autoparallelize(plain, mesh={"dp": 2}, hardware=FAST)
    del plain
    model(*inputs).backward()
    dropped = weakref.ref(model)
    del model
    gc.collect()
    return dropped() is None


def step_counting_gradient_buckets(rank, world_size, model_bytes, batch, plan_json, bucket_bytes):
    """One training step of the plan with gradient syncs bucketed at ``bucket_bytes``: the loss,
    the gradients (whole) and how many buckets went out."""
    import io

    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule
    from autopar.runtime.state import whole

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    rt = rank_mesh_for(plan.mesh)
    rt.bucket_bytes, before = bucket_bytes, rt.calls["gradient bucket"]
    try:
        loss = ParallelModule(model, plan, rt, plan.emit("torch"))(*batch)
        loss.backward()
    finally:
        rt.bucket_bytes = autopar.ir.hardware.GRADIENT_BUCKET_BYTES
    return {"loss": loss.item(), "buckets": rt.calls["gradient bucket"] - before,
            "grads": {n: whole(p.grad) for n, p in model.named_parameters()}}


def compiled_training_steps(rank, world_size, model_bytes, inputs, plan_json, steps, inductor_cache_dir):
    """check's steps of the plan with compile=True, Inductor's caches in ``inductor_cache_dir``,
    and what Dynamo and Inductor counted meanwhile: the graphs Dynamo compiled, the graph breaks
    it met, and the graphs Inductor compiled (cache misses) or loaded from its cache (hits)."""
    from torch._dynamo.utils import counters

    from autopar.check import _run_on_rank

    torch._dynamo.reset()
    counters.clear()
    with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir}):
        result = _run_on_rank(rank, world_size, model_bytes, inputs, {}, plan_json, steps, 0.1, False, True)
    result["graphs"] = counters["stats"]["unique_graphs"]
    result["graph_breaks"] = dict(counters["graph_break"])
    result["inductor_compiles"] = counters["inductor"]["fxgraph_cache_miss"]
    result["inductor_cache_hits"] = counters["inductor"]["fxgraph_cache_hit"]
    return result


def functional_and_eager_collectives(rank, world_size):
    """Each collective of a program's runtime, eager (RankMesh) and functional (TracedCollectives),
    on the same rank-dependent tensor: the pairs must agree."""
    from autopar.check import rank_mesh_for
    from autopar.runtime.traced_collectives import TracedCollectives

    rt = rank_mesh_for(autopar.Mesh.of(dp=2))
    traced = TracedCollectives(rt)
    x = torch.arange(24.0).reshape(2, 4, 3) * (rank + 1)
    calls = {
        "all_reduce": lambda m: m.all_reduce(x, "dp"),
        "all_gather dim 0": lambda m: m.all_gather(x, "dp", 0),
        "all_gather dim 1": lambda m: m.all_gather(x, "dp", 1),
        "reduce_scatter dim 1": lambda m: m.reduce_scatter(x, "dp", 1),
        "all_to_all 0->1": lambda m: m.all_to_all(x, "dp", src_dim=0, dst_dim=1),
        "all_to_all 2->0": lambda m: m.all_to_all(x[:, :, :2], "dp", src_dim=2, dst_dim=0),
        "gradient all_reduce": lambda m: m.wait(m.start_all_reduce(x, "dp")),
        "gradient reduce_scatter dim 2": lambda m: m.wait(m.start_reduce_scatter(x[:, :, :2], "dp", 2)),
    }
    plain = (lambda t: t.wait() if hasattr(t, "wait") else t)  # an AsyncCollectiveTensor, once waited for
    return {name: (call(rt), plain(call(traced))) for name, call in calls.items()}


def bucket_buffers_over_three_backwards(rank, world_size, model_bytes, batches, plan_json):
    """Two backwards that accumulate into ``.grad`` (the first's gradients, handed out from its
    bucket's buffer, are still read), then a third after the gradients were dropped: the summed
    gradients, and how many bucket buffers the runtime held after the second and the third."""
    import io

    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule
    from autopar.runtime.state import whole

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    rt = rank_mesh_for(plan.mesh)
    rt._bucket_buffers.clear()
    parallel = ParallelModule(model, plan, rt, plan.emit("torch"))
    counts = []
    for i, batch in enumerate(batches):
        parallel(*batch).backward()
        if i == 1:
            summed = {n: whole(p.grad) for n, p in model.named_parameters()}
            model.zero_grad()
        counts.append(sum(len(buffers) for buffers in rt._bucket_buffers.values()))
    return {"summed": summed, "buffers": counts}


def all_reduces_at_their_inputs_last_read(rank, world_size):
    """An all-reduce marked as its input's last read runs in the input's memory only where no other
    tensor shares it: not where a view of it lives on, nor on a value zero_partial passed through."""
    from autopar.check import rank_mesh_for

    rt = rank_mesh_for(autopar.Mesh.of(dp=2))
    alone = torch.full((4,), float(rank + 1))
    reduced = rt.all_reduce(alone, "dp", last_read=True)
    viewed = torch.full((4,), float(rank + 1))
    view = viewed[1:]
    rt.all_reduce(viewed, "dp", last_read=True)
    kept = torch.full((4,), float(rank + 1))
    rt.all_reduce(rt.zero_partial(kept, "dp"), "dp", last_read=True)
    return {"in place": reduced is alone, "view": view.tolist(), "kept": kept.tolist(),
            "reduced": reduced.tolist()}


def train_offloaded(rank, world_size, model_bytes, inputs, plan_json, steps, settings):
    """``steps`` AdamW steps of an offloading plan through autoparallelize: the losses, the
    parameters whole, and the memory of a step after the first (when the optimizer state
    exists): MemTracker's peak over the step (every tensor of the process, host and "device"
    alike on CPU), the host bytes of the step (the chunks and the offloaded state), and the
    chunk store's own counts."""
    import io

    from torch.distributed._tools.mem_tracker import MemTracker

    from autopar.parallelize import parallel_module

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    wrapped = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, example_inputs=inputs)
    wrapped(*inputs)  # distributes the parameters: the optimizer is built on their DTensors
    opt = torch.optim.AdamW(model.parameters(), **settings)
    store = parallel_module(wrapped).chunks
    losses, memory = [], {}

    def step():
        loss = wrapped(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())

    for k in range(steps):
        if k != 1:
            step()
            continue
        tracker = MemTracker()
        tracker.track_external(model, opt)
        store.peak = store.device_steps = 0
        with tracker:
            step()
        offloaded = set(store.slices)
        state = sum(t.to_local().numel() * t.element_size() for n, p in model.named_parameters() if n in offloaded
                    for t in opt.state[p].values() if t.dim())
        grads = sum(p.to_local().numel() * p.element_size() for n, p in model.named_parameters() if n in offloaded)
        memory = {"tracked_peak": sum(s["Total"] for s in tracker.get_tracker_snapshot("peak").values()),
                  "host": sum(h.numel() * h.element_size() for h in store.host.values()) + state + grads,
                  "chunk_peak": store.peak, "fetched": store.fetched_bytes, "device_steps": store.device_steps}
    params = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "params": params, "memory": memory}


def train_offloaded_pipeline(rank, world_size, model_bytes, inputs, plan_json, steps, settings):
    """``steps`` AdamW steps of a pipelined plan whose stages keep their state in host memory,
    through autoparallelize, the optimizer built before the first call: the losses, this rank's
    parameters whole, and the bytes its stages
    moved up and down in the last step and the most they held on the device at once."""
    import io

    from autopar.parallelize import parallel_module

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    wrapped = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, example_inputs=inputs)
    opt = torch.optim.AdamW(model.parameters(), **settings)
    losses = []
    for _ in range(steps):
        host = getattr(parallel_module(wrapped), "host", None)
        if host is not None:
            host.reset_counters()
        loss = wrapped(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    host = parallel_module(wrapped).host
    params = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "params": params,
            "moved": {"up": host.up_bytes, "down": host.down_bytes, "peak": host.peak_bytes}}


def offloaded_after_assigning_a_state_dict(rank, world_size, model_bytes, inputs, plan_json):
    """An offloading model given new parameter tensors by load_state_dict(assign=True): the
    AutoparError's text of the next call (None if it ran)."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    wrapped = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, example_inputs=inputs)
    wrapped(*inputs)
    model.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()}, assign=True)
    try:
        wrapped(*inputs)
    except autopar.AutoparError as exc:
        return str(exc)
    return None


def run_the_plan_of_this_rank(rank, world_size, plans_json, inputs):
    """Each rank runs the plan it is given (ranks may be given different ones): the error, if any."""
    from autopar.runtime.module import ParallelModule
    from autopar.runtime.rank_mesh import RankMesh
    from examples import mlp

    model, _ = mlp.make(batch=8, width=32, hidden=64)
    plan = autopar.Plan.from_json(plans_json[rank])
    try:
        ParallelModule(model, plan, RankMesh(plan.mesh), plan.emit("torch"))(*inputs).backward()
    except autopar.AutoparError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def stop_early_on_rank_1(rank, world_size, plan_json, inputs, timeout_s):
    """Rank 1 runs one step and leaves; the others run two: their second step's collective never completes."""
    import time

    from autopar.runtime.module import ParallelModule
    from autopar.runtime.rank_mesh import RankMesh
    from examples import mlp

    model, _ = mlp.make(batch=8, width=32, hidden=64)
    plan = autopar.Plan.from_json(plan_json)
    parallel = ParallelModule(model, plan, RankMesh(plan.mesh, timeout_s=timeout_s), plan.emit("torch"))
    parallel(*inputs).backward()
    if rank == 1:
        return {"error": None}
    start = time.monotonic()
    try:
        parallel(*inputs).backward()
    except autopar.CollectiveTimeoutError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    return {"error": None}


def train_searched(rank, world_size, model_bytes, inputs, mesh, hardware, steps):
    """``steps`` SGD steps of a model autoparallelized with a searched mesh (mesh=N or "auto"):
    each step's loss, the mesh its first call chose and the search's record, or the error."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    wrapped = autopar.autoparallelize(model, mesh=mesh, hardware=hardware)
    try:
        loss = wrapped(*inputs)
    except autopar.AutoparError as exc:
        return {"error": str(exc)}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(steps):
        loss = loss if i == 0 else wrapped(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    plan = autopar.plan_of(model)
    return {"error": None, "losses": losses, "mesh": str(plan.device_mesh), "searched": plan.history[0].note}


def train_compiled_mixed(rank, world_size, model_bytes, kwargs, plan_json, steps):
    """``steps`` SGD steps of a model autoparallelized with compile=True under a mixed-precision
    plan, called with keywords: each step's loss and the first step's gradients, whole."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    wrapped = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, compile=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], {}
    for i in range(steps):
        loss = wrapped(**kwargs).loss
        loss.backward()
        if i == 0:
            grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads}
