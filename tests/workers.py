"""Jobs run on every rank of a local gloo group by tests (importable by workers)."""
import dataclasses

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

    opt = None  # built after the first call, which shards an autoparallelized model's parameters
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
            opt = opt or torch.optim.SGD(model.parameters(), lr=lr)
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


def make_optimizer(name: str, params, foreach: bool):
    if name == "adamw":
        # eps 1e-6, not 1e-8: a gradient that is zero in exact math (attention's key bias) is
        # summation-order noise of ~1e-10, which eps 1e-8 turns into updates of ~1e-4 that differ
        # between any two summation orders, eager's included
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, eps=1e-6, foreach=foreach)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=foreach)


def train_clipped(model, batch, optimizer: str, foreach: bool, steps: int = 3, max_norm: float = 0.1,
                  autocast=None):
    """``steps`` steps of ``optimizer`` with the gradients clipped to ``max_norm``: per step the
    loss and the norm clip_grad_norm_ returned; then each parameter, whole. ``autocast``: the
    dtype eager's forward runs under torch.autocast in."""
    from autopar.runtime.state import whole

    opt = make_optimizer(optimizer, model.parameters(), foreach)
    losses, norms = [], []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = model(*batch)
        loss.backward()
        norms.append(whole(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)).item())
        opt.step()
        losses.append(loss.item())
    state = {str(v.dtype) for per_param in opt.state.values() for v in per_param.values() if v.dim() > 0}
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        next_loss = model(*batch).item()  # with gradients on: the training step's program, no new plan
    return {"losses": losses, "norms": norms, "params": {n: whole(p).detach() for n, p in model.named_parameters()},
            "state_dtypes": sorted(state), "next_loss": next_loss}


def train_dtensor_state(rank, world_size, model_bytes, batch, mesh, optimizer, foreach):
    """The model autoparallelized with example inputs (sharded at once), then ``train_clipped``;
    also what the parameters, gradients and optimizer state are: types and placements."""
    import io

    from torch.distributed.tensor import DTensor

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch)
    out = train_clipped(model, batch, optimizer, foreach)
    plan = autopar.plan_of(model)
    placements = {fqn: plan.param_spec(fqn).to_dtensor() for fqn in plan.graph.params.values()}
    out["dtensors"] = all(isinstance(p, DTensor) and isinstance(p.grad, DTensor) and
                          tuple(p.placements) == placements[n] == tuple(p.grad.placements)
                          for n, p in model.named_parameters())
    out["sharded"] = sum(p.to_local().numel() < p.numel() for p in model.parameters())
    return out


def step_an_optimizer_built_too_early(rank, world_size, model_bytes, batch, mesh):
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(*batch).backward()
    try:
        opt.step()
    except autopar.AutoparError as exc:
        return str(exc)
    return None


def _autoparallelized(model_bytes, batch, mesh, plan_json=None):
    """The model from ``model_bytes``, autoparallelized on ``mesh`` and sharded at once, with an
    AdamW built on its DTensor parameters."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = None if plan_json is None else autopar.Plan.from_json(plan_json)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch, plan=plan)
    return model, make_optimizer("adamw", model.parameters(), foreach=True)


def _steps(model, opt, batch, steps: int) -> list:
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(*batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_and_checkpoint(rank, world_size, model_bytes, batch, mesh, steps, save_after, directory):
    """``steps`` AdamW steps, the model and optimizer state saved with torch.distributed.checkpoint
    after ``save_after`` of them: the losses of every step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = _autoparallelized(model_bytes, batch, mesh)
    losses = _steps(model, opt, batch, save_after)
    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    return losses + _steps(model, opt, batch, steps - save_after)


def resume_from_checkpoint(rank, world_size, model_bytes, batch, mesh, steps, directory):
    """A fresh model and optimizer on ``mesh`` (any plan), loaded from the checkpoint through
    torch's get_state_dict/set_state_dict, then ``steps`` steps: their losses."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, opt = _autoparallelized(model_bytes, batch, mesh)
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return _steps(model, opt, batch, steps)


def train_and_export_pretrained(rank, world_size, model_bytes, batch_kwargs, mesh, directory):
    """Two AdamW steps of a Hugging Face model called with keywords, then its full state dict
    (torch's get_model_state_dict, gathered to rank 0) saved by save_pretrained on rank 0: the
    logits of the trained model, whole."""
    import io

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_kwargs=batch_kwargs)
    opt = make_optimizer("adamw", model.parameters(), foreach=True)
    for _ in range(2):
        opt.zero_grad()
        model(**batch_kwargs).loss.backward()
        opt.step()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        model.save_pretrained(directory, state_dict=full)
    with torch.no_grad():
        return model(**batch_kwargs).logits.full_tensor()


def train_on_local_batches(rank, world_size, model_bytes, dataset_tensors, mesh, local_batch):
    """inputs="local" as under torchrun: each data-parallel block of ranks reads its own samples
    through a DistributedSampler set up from autopar.data_parallel_info; SGD over the dataset.
    The losses, (rank, size) of the data-parallel block, and the parameters, whole."""
    import io

    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, inputs="local")
    dp_rank, dp_size = autopar.data_parallel_info(model)
    dataset = TensorDataset(*dataset_tensors)
    loader = DataLoader(dataset, batch_size=local_batch,
                        sampler=DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank, shuffle=False))
    opt, losses = None, []
    for batch in loader:
        loss = model(*batch)
        opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "data_parallel": (dp_rank, dp_size),
            "params": {n: p.full_tensor().detach() for n, p in model.named_parameters()}}


def _tiny_gpt2_on_meta(seed: int = 0):
    from examples import gpt2

    torch.manual_seed(seed)
    with torch.device("meta"):
        return gpt2.GPT2(gpt2.SIZES["tiny"])


def materialize_on_meta(rank, world_size, batch, mesh):
    """GPT-2 tiny built on the meta device and autoparallelized (rank 0 initializes one module at
    a time, each rank allocates its blocks): its parameters, whole, and two SGD steps' losses."""
    model = _tiny_gpt2_on_meta()
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch)
    params = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}  # before training
    return {"params": params, "losses": _steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, 2)}


def materialization_memory(rank, world_size, batch, mesh):
    """The runtime's materialization of a meta model alone, under torch's MemTracker: this rank's
    peak bytes, and the bytes of its parameters' blocks afterwards."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from autopar.check import rank_mesh_for
    from autopar.parallelize import initializer
    from autopar.runtime.module import ParallelModule

    model = _tiny_gpt2_on_meta()
    plan = autopar.plan(model, batch, mesh=mesh, hardware=FAST)  # planning holds fake tensors only
    tracker = MemTracker()
    with tracker:
        ParallelModule(model, plan, rank_mesh_for(plan.mesh), plan.emit("torch"),
                       init=initializer("reset_parameters"))
    peak = sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
    return {"peak": peak, "blocks": sum(p.to_local().numel() * p.element_size() for p in model.parameters())}


def load_full_state_dict_streamed(rank, world_size, state_bytes, batch, mesh):
    """A meta model left uninitialized (init=None), then rank 0's full state dict loaded with
    torch's set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True): two SGD steps."""
    import io

    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model = _tiny_gpt2_on_meta()
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch, init=None)
    full = torch.load(io.BytesIO(state_bytes)) if rank == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return _steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, 2)


class ScaledLinear(nn.Module):
    """A linear layer times a non-persistent buffer (no state dict holds it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 2.0), persistent=False)

    def forward(self, x):
        return (self.fc(x) * self.scale).pow(2).mean()


def meta_model_left_uninitialized(rank, world_size):
    """init=None on a meta model with a non-persistent buffer: refused on every rank."""
    with torch.device("meta"):
        model = ScaledLinear()
    try:
        autopar.autoparallelize(model, mesh="dp=2", hardware=FAST, example_inputs=(torch.randn(4, 8),), init=None)
    except autopar.AutoparError as exc:
        return str(exc)
    return None


def real_on_rank0_meta_elsewhere(rank, world_size, model_bytes, batch, mesh):
    """Rank 0 holds the model's values, the others build it on the meta device (FSDP's
    sync_module_states pattern): every rank gets rank 0's blocks; two SGD steps' losses."""
    import io

    from examples import gpt2

    if rank == 0:
        model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    else:
        with torch.device("meta"):
            model = gpt2.GPT2(gpt2.SIZES["tiny"])
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch, init=None)
    return _steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, 2)


def local_batches_that_disagree(rank, world_size, model_bytes, case):
    """inputs="local" with each rank's batch its own ("peers differ": tp peers pass different
    samples) or of its own length ("ragged"): the error every rank raises."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh="dp=2,tp=2", hardware=FAST, inputs="local")
    g = torch.Generator().manual_seed(rank)
    length = 32 if case == "peers differ" or rank < 2 else 16
    idx = torch.randint(0, 256, (4, length), generator=g)
    try:
        model(idx, idx)
    except autopar.AutoparError as exc:
        return str(exc)
    return None


def train_bf16_mixed(rank, world_size, model_bytes, batch, mesh):
    """The model autoparallelized with precision="bf16-mixed", then ``train_clipped`` with AdamW;
    the dtypes of its parameters, gradients and optimizer state, and what calls under autocast do."""
    import io

    from torch.distributed.tensor import DTensor

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch, precision="bf16-mixed")
    out = train_clipped(model, batch, "adamw", True)
    out["master_dtypes"] = sorted({str(p.dtype) for p in model.parameters()} | {str(p.grad.dtype)
                                                                                 for p in model.parameters()})
    out["dtensors"] = all(isinstance(p, DTensor) and isinstance(p.grad, DTensor) for p in model.parameters())
    out["sharded"] = sum(p.to_local().numel() < p.numel() for p in model.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the plan's own dtype: runs as without
        out["loss_under_matching_autocast"] = model(*batch).item()
    with torch.no_grad():  # a forward program, planned now in the same precision
        out["no_grad_loss"] = model(*batch).item()
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            model(*batch)
        out["other_autocast"] = None
    except autopar.AutoparError as exc:
        out["other_autocast"] = str(exc)
    return out


class OverflowingLinear(nn.Module):
    """A gain whose gradient stays small (replicated), then a linear layer whose first four
    output rows get gradients too large for float16 at a loss scale of 2**16 and fine at 2**15."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(8))
        self.fc = nn.Linear(8, 8, bias=False)
        self.register_buffer("weights", torch.tensor([1.5] * 4 + [1e-3] * 4))

    def forward(self, x):
        return (self.fc(x) * self.weights).sum() + 1e-3 * (x * self.gain).sum()


def scaled_fp16_steps(model, x, steps: int = 3, autocast: bool = False):
    """``steps`` SGD steps with torch.amp.GradScaler: per step whether it was taken (the scale
    stayed) and the scale after it; then the parameters, whole."""
    from autopar.runtime.state import whole

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    taken, scales = [], []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = model(x)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        taken.append(scaler.get_scale() >= before)
        scales.append(scaler.get_scale())
    return {"taken": taken, "scales": scales, "params": {n: whole(p).detach() for n, p in model.named_parameters()}}


def train_fp16_with_loss_scaling(rank, world_size, model_bytes, x, plan_json):
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    autopar.autoparallelize(model, mesh=plan.mesh, plan=plan, example_inputs=(x,))
    out = scaled_fp16_steps(model, x)
    out["local_rows"] = tuple(model.fc.weight.to_local().shape)
    with torch.no_grad():  # a forward program, planned now: in the given plan's precision
        model(x)
    programs = autopar.parallelize.parallel_module(model).programs.values()
    out["programs"] = sorted((p.plan.graph.kind, p.plan.graph.autocast) for p in programs)
    return out


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
