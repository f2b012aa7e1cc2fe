"""Jobs on every rank of a local gloo group for the mixed-precision tests; importable by workers."""
import torch
from torch import nn

import autopar
from tests.state_workers import train_clipped
from tests.workers import FAST


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
