"""Jobs on every rank of a local gloo group for the training-state tests (DTensor parameters,
optimizers, clipping, checkpoints, meta init, local inputs); importable by workers."""
import torch
from torch import nn

import autopar
from tests.workers import FAST


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


def train_dtensor_state(rank, world_size, model_bytes, batch, mesh, optimizer, foreach, passes=()):
    """The model autoparallelized with example inputs (sharded at once; ``passes`` added to its
    plan's), then ``train_clipped``; also what the parameters, gradients and optimizer state
    are: types and placements."""
    import io

    from torch.distributed.tensor import DTensor

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch, passes=passes)
    out = train_clipped(model, batch, optimizer, foreach)
    plan = autopar.plan_of(model)
    placements = {fqn: plan.param_spec(fqn).to_dtensor() for fqn in plan.graph.params.values()}
    out["dtensors"] = all(isinstance(p, DTensor) and isinstance(p.grad, DTensor) and
                          tuple(p.placements) == placements[n] == tuple(p.grad.placements)
                          for n, p in model.named_parameters())
    out["sharded"] = sum(p.to_local().numel() < p.numel() for p in model.parameters())
    return out


def train_with_an_optimizer_built_first(rank, world_size, model_bytes, batch, mesh, steps, stepped_first=False):
    """AdamW with weight-decay groups from named_parameters() and a learning-rate scheduler,
    built right after autoparallelize (before the first call shards the model), as training
    scripts do; ``steps`` steps: each loss and the parameters after, whole (this rank's stages').
    ``stepped_first``: the optimizer steps once on the unsharded model first; the error its next
    step raises."""
    import io

    from autopar.runtime.state import whole

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    opt, scheduler = _adamw_with_groups(model)
    if stepped_first:
        model(*batch).backward()
        opt.step()
        opt.zero_grad()
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST)
    try:
        losses = _scheduled_steps(model, opt, scheduler, batch, steps)
    except autopar.AutoparError as exc:
        return {"error": str(exc)}
    params = {n: whole(p).detach() for n, p in model.named_parameters()}  # a pipeline rank: its stages'
    return {"error": None, "losses": losses, "params": params, "lr": opt.param_groups[0]["lr"]}


def _adamw_with_groups(model):
    """AdamW decaying the matrices only (nanoGPT's groups), its learning rate halved every step."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    # eps 1e-6 as make_optimizer's, for the same reason
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=0.01,
                            eps=1e-6)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _scheduled_steps(model, opt, scheduler, batch, steps: int) -> list:
    losses = []
    for _ in range(steps):
        loss = model(*batch)
        loss.backward()
        opt.step()
        scheduler.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def train_eager_with_groups(model, batch, steps):
    opt, scheduler = _adamw_with_groups(model)
    losses = _scheduled_steps(model, opt, scheduler, batch, steps)
    return {"losses": losses, "params": {n: p.detach() for n, p in model.named_parameters()},
            "lr": opt.param_groups[0]["lr"]}


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


def train_and_checkpoint(rank, world_size, model_bytes, batch, mesh, steps, save_after, directory, flat=False):
    """``steps`` AdamW steps, the model and optimizer state saved with torch.distributed.checkpoint
    after ``save_after`` of them: the losses of every step. ``flat``: the optimizer state keyed by
    parameter name (torch's flatten_optimizer_state_dict), as a pipeline's stages need: their
    param groups hold other parameters under the same index."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, opt = _autoparallelized(model_bytes, batch, mesh)
    losses = _steps(model, opt, batch, save_after)
    model_state, optim_state = get_state_dict(model, opt, options=StateDictOptions(flatten_optimizer_state_dict=flat))
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    return losses + _steps(model, opt, batch, steps - save_after)


def resume_from_checkpoint(rank, world_size, model_bytes, batch, mesh, steps, directory, flat=False):
    """A fresh model and optimizer on ``mesh`` (any plan), loaded from the checkpoint through
    torch's get_state_dict/set_state_dict, then ``steps`` steps: their losses."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    model, opt = _autoparallelized(model_bytes, batch, mesh)
    model_state, optim_state = get_state_dict(model, opt, options=options)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
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
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch, init="reset_parameters")
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
    torch's set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True): two SGD steps.
    A pipeline rank holds its stages' entries alone, so it loads with strict=False (as
    torchtitan loads a pipeline's model chunks): the full dict's other entries are not its."""
    import io

    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model = _tiny_gpt2_on_meta()
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, example_inputs=batch, init=None)
    full = torch.load(io.BytesIO(state_bytes)) if rank == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                               strict="pp" not in mesh))
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


def train_pipelined_and_save_model(rank, world_size, model_bytes, batch, mesh, steps, directory):
    """``steps`` SGD steps of a model autoparallelized on a pipelined mesh, then its model state
    saved with torch.distributed.checkpoint: the keys this rank's state dict holds, and its
    parameters, whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from autopar.runtime.state import whole

    model, _ = _autoparallelized(model_bytes, batch, mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _steps(model, opt, batch, steps)
    state = get_model_state_dict(model)
    dcp.save({"model": state}, checkpoint_id=directory)
    return {"keys": sorted(model.state_dict()), "params": {n: whole(p).detach() for n, p in model.named_parameters()}}
