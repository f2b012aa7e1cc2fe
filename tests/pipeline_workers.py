"""Jobs of pipelined models (and K-FAC in their bubbles) run on every rank of a local gloo group
by tests (importable by workers)."""
import torch

import autopar
from tests.workers import FAST


def train_pipelined(rank, world_size, model_bytes, inputs, mesh, schedule, steps, given="global"):
    """``steps`` SGD steps of an autoparallelized model on a pipelined mesh: each step's loss,
    this rank's gradients after the first step, the gradients of a backward seeded with 2 (a
    loss weight), the loss of a call under no_grad and which parameters this rank holds.
    ``given="local"``: each rank passes its data-parallel block of ``inputs``."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    wrapped = autopar.autoparallelize(model, mesh=mesh, hardware=FAST, schedule=schedule, inputs=given)
    if given == "local":
        block, blocks = autopar.data_parallel_info(wrapped)
        inputs = tuple(t.chunk(blocks)[block] for t in inputs)
    opt, losses, grads = None, [], {}
    for i in range(steps):
        loss = wrapped(*inputs)
        opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
        loss.backward()
        if i == 0:
            grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    (2 * wrapped(*inputs)).backward()
    doubled = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.zero_grad()
    with torch.no_grad():
        evaluated = wrapped(*inputs).item()
    again = wrapped(*inputs).item()  # a step whose loss nobody differentiates leaves .grad alone
    held = sorted(n for n, p in model.named_parameters() if not p.is_meta)
    untouched = all(p.grad is None for p in model.parameters())
    return {"losses": losses, "grads": grads, "doubled": doubled, "evaluated": evaluated, "again": again,
            "held": held, "untouched": untouched}


def evaluate_pipelined(rank, world_size, model_bytes, inputs, mesh):
    """A call under no_grad of an autoparallelized model on a pipelined mesh: its loss, or the
    AutoparError it raised."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    wrapped = autopar.autoparallelize(model, mesh=mesh, hardware=FAST, schedule="1F1B", microbatches=4)
    try:
        with torch.no_grad():
            return {"loss": wrapped(*inputs).item(), "error": None}
    except autopar.AutoparError as exc:
        return {"loss": None, "error": str(exc)}


def train_kfac(rank, world_size, model_bytes, inputs, plan_json, steps, settings, autoparallelized=False):
    """``steps`` K-FAC steps (autopar.KFAC) of a pipelined plan made with optimizer="kfac", run
    by a PipelinedModule or (``autoparallelized``) by autoparallelize: each step's loss and,
    after the last, the parameters this rank holds, whole."""
    import io

    from autopar.check import rank_mesh_for
    from autopar.runtime.pipeline import PipelinedModule

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    if autoparallelized:
        pipelined = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, example_inputs=inputs)
    else:
        pipelined = PipelinedModule(model, plan, rank_mesh_for(plan.mesh, plan.pipeline.pp), plan.emit("torch"))
    opt = autopar.KFAC(pipelined, **settings)
    losses = []
    for _ in range(steps):
        loss = pipelined(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    held = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters() if not p.is_meta}
    return {"losses": losses, "params": held}


def kfac_accumulating_two_calls(rank, world_size, model_bytes, inputs, plan_json):
    """Two training calls of a K-FAC plan before one autopar.KFAC step: the AutoparError's text."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    wrapped = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, example_inputs=inputs)
    autopar.KFAC(wrapped, lr=0.1)
    wrapped(*inputs).backward()
    try:
        wrapped(*inputs).backward()
    except autopar.AutoparError as exc:
        return str(exc)
    return None


def kfac_with_two_parameter_groups(rank, world_size, model_bytes, inputs, plan_json):
    """The AutoparError autopar.KFAC's step raises once a second parameter group is added."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    wrapped = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, example_inputs=inputs)
    opt = autopar.KFAC(wrapped, lr=0.1)
    wrapped(*inputs).backward()
    opt.add_param_group({"params": [torch.zeros(1, requires_grad=True)], "lr": 0.5})
    try:
        opt.step()
    except autopar.AutoparError as exc:
        return str(exc)
    return None


def keyword_call_pipelined(rank, world_size, model_bytes, kwargs, mesh, schedule, given="global"):
    """One step of an autoparallelized model called with keywords on a pipelined mesh: the
    output's type, its loss, its logits (whole) and what was warned. ``given="local"``: each
    rank passes its data-parallel block of every keyword's tensor."""
    import io
    import warnings

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    wrapped = autopar.autoparallelize(model, mesh=mesh, hardware=FAST, schedule=schedule, microbatches=4,
                                      inputs=given)
    if given == "local":
        block, blocks = autopar.data_parallel_info(wrapped)
        kwargs = {name: t.chunk(blocks)[block] for name, t in kwargs.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = wrapped(**kwargs)
        out.loss.backward()
    return {"type": type(out).__name__, "loss": out.loss.item(), "logits": out.logits.full_tensor(),
            "warned": [str(w.message) for w in caught]}


def clipped_pipelined(rank, world_size, model_bytes, inputs, mesh, schedule):
    """One step of an autoparallelized model on a pipelined mesh whose gradients torch's own
    clip_grad_norm_ clips: the norm it returned, the clipped gradients (by the name eager gives
    them), and the max-norm autopar.clip_grad_norm_ returns after."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    wrapped = autopar.autoparallelize(model, mesh=mesh, hardware=FAST, schedule=schedule)
    wrapped(*inputs).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    tied = autopar.plan_of(model).graph.tied
    grads = {tied.get(n, n): p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None}
    largest = autopar.clip_grad_norm_(model.parameters(), 1e9, norm_type="inf")
    return {"norm": norm.full_tensor().item(), "grads": grads, "largest": largest.full_tensor().item()}


def accumulate_pipelined(rank, world_size, model_bytes, batches, plan_json):
    """Gradients of ``batches`` accumulated in .grad by a pipelined model, every call but the last
    under no_sync(), each loss weighed 1/len(batches): this rank's, whole."""
    import contextlib
    import io

    from autopar.check import rank_mesh_for
    from autopar.runtime.pipeline import PipelinedModule

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    pipelined = PipelinedModule(model, plan, rank_mesh_for(plan.mesh, plan.pipeline.pp), plan.emit("torch"))
    for k, batch in enumerate(batches):
        with pipelined.no_sync() if k < len(batches) - 1 else contextlib.nullcontext():
            (pipelined(*batch) / len(batches)).backward()
    return {n: p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None}


def validate_between_steps_pipelined(rank, world_size, model_bytes, inputs, mesh, steps):
    """``train_then_validate`` on the model autoparallelized on a pipelined mesh."""
    import io

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    autopar.autoparallelize(model, mesh=mesh, hardware=FAST, schedule="1F1B", microbatches=4)
    return train_then_validate(model, inputs, steps)


def train_then_validate(model, inputs, steps):
    """``steps`` rounds of a training step (SGD, the random state seeded with the step's index)
    and a validation call in evaluation mode under no_grad, as training scripts interleave them:
    the losses in that order."""
    opt, losses = torch.optim.SGD(model.parameters(), lr=0.1), []
    for i in range(steps):
        model.train()
        torch.manual_seed(i)
        loss = model(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            losses += [loss.item(), model(*inputs).item()]
    return losses
