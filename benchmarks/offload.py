"""Offload (PatrickStar-style host chunks): how much larger a model fits, what it costs against
FSDP2's offload-everything policy, and the predicted step time against a measured one.

    python benchmarks/offload.py [--width 8192] [--time-limit 20] [--rounds 8] [--skip-search] [--skip-measured]
                                 [--mesh dp=8]

With ``--mesh pp=8`` part 1 searches a pipeline, whose offload keeps whole stages in host memory
(autopar.planning.stage_offload), and part 2 is skipped (it prices flat plans).

1. Largest model (planned on the meta device, 8 x a100-sxm-80g as mesh dp=8, default budget:
   90% of 80 GB; host memory 1 TB per node, i.e. 125 GB per device): a GPT-shaped decoder
   (examples/gpt2.py) of width 8192, 32 heads, vocabulary 32000, sequence 1024, batch 8 (one
   sequence per device), float32 parameters and Adam (16 bytes per parameter: weight, gradient,
   two moments). Width 8192 rather than 4096 because planning time grows with the layer count,
   not the width, and the largest offloaded model at width 4096 needs hundreds of layers. The
   layer count is searched by doubling from 8 layers, then bisection, with offload=False, then
   with offload="auto" (starting from the largest that fits without offload: whatever fits on
   the device also fits with "auto"). Each attempt prints a line; then a summary of the two
   largest and their device memory by category.
2. Against "everything offloaded" (FSDP2's CPUOffloadPolicy), at the largest model with
   offload and at the largest without: autopar's "auto" plan, autopar with offload=True (every
   chunk on the host), and FSDP2's policy priced in the same cost model figures (fsdp2_offload
   below says how), side by side with ratios to the "auto" plan.
3. Measured (4 gloo processes on this machine, hardware "cpu": the calibrated spec, made here
   with `autopar calibrate`'s routine when absent or older than offload's host figures): the
   "small" GPT-2-style decoder on dp=4 under a budget of 40% of the offload=False plan's peak
   (a budget only offload meets), and the offload=False plan with no budget; AdamW steps of
   both, interleaved over rounds; the slowest rank's median step beside the prediction.

The last line reads ``largest model with offload / without: X.XX`` (the parameter-count ratio).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.cost_models.hardware import calibrated_cpu_path, get_hardware, save_hardware  # noqa: E402
from autopar.inspect.offload_view import optimizer_text  # noqa: E402
from autopar.runtime.local_cluster import get_cluster  # noqa: E402
from autopar.units import human_bytes, human_seconds  # noqa: E402
from examples import gpt2  # noqa: E402

HARDWARE, MESH = "a100-sxm-80g", "dp=8"
SHORT = {"parameters": "param", "optimizer_state": "optim", "inputs": "input", "gradients": "grad",
         "activations": "act", "temporaries": "temp", "communication": "comm"}
CPU_SIZE, CPU_MESH, CPU_BUDGET_SHARE = "small", "dp=4", 0.4
ADAMW = {"lr": 1e-3}


# ---- 1. the largest model ---------------------------------------------------------------
@dataclass
class Attempt:
    layers: int
    params: int  # the whole model's
    plan: autopar.Plan | None  # None: nothing fits
    error: str
    seconds: float  # planning wall time


class Planner:
    """Plans the GPT-shaped model at a layer count, keeps every attempt and prints its line."""

    def __init__(self, width: int, time_limit: float, mesh: str):
        self.width, self.time_limit, self.mesh = width, time_limit, mesh
        self.attempts: list[tuple[object, Attempt]] = []  # (offload setting, attempt)

    def config(self, layers: int) -> gpt2.GPT2Config:
        return gpt2.GPT2Config(vocab=32000, seq=1024, layers=layers, heads=32, width=self.width, batch=8)

    def attempt(self, layers: int, offload, budget=None) -> Attempt:
        model, inputs = gpt2.make(self.config(layers), device="meta")
        params = sum(p.numel() for p in model.parameters())
        start = time.perf_counter()
        plan, error = None, ""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # solver gaps: the time limit is modest on purpose
            try:
                plan = autopar.plan(model, inputs, mesh=self.mesh, hardware=HARDWARE, offload=offload,
                                    memory_budget=budget, solver_time_limit_s=self.time_limit, cache=False)
            except autopar.AutoparError as exc:
                error = str(exc)
        found = Attempt(layers, params, plan, error, time.perf_counter() - start)
        self.attempts.append((offload, found))
        print(attempt_line(offload, found), flush=True)
        return found

    @property
    def seconds(self) -> float:
        return sum(a.seconds for _, a in self.attempts)


def chunks_note(o) -> str:
    return f"{len(o.chunks)} chunks of {human_bytes(o.chunk_bytes)}, {o.slots} on device" if o else "no offload"


def offload_note(plan: autopar.Plan) -> tuple[float, str]:
    """(host bytes per device, what is offloaded) of a flat plan's chunks or a pipeline's stages."""
    staged = plan.pipeline.offload if plan.pipeline is not None else None
    if staged is not None:
        pl = plan.pipeline
        return max(staged.host_bytes), f"whole stages ({pl.schedule}, {pl.microbatches} micro-batches)"
    return (plan.offload.host_bytes if plan.offload else 0.0), chunks_note(plan.offload)


def attempt_line(offload, a: Attempt) -> str:
    head = f"  offload={str(offload):<5} {a.layers:>4} layers {a.params / 1e9:7.2f} B params  "
    if a.plan is None:
        return head + f"fits no   ({a.seconds:5.1f} s to plan)"
    p, (host, what) = a.plan.predicted, offload_note(a.plan)
    return head + (f"fits yes  step {human_seconds(p.step_time_s):>9}  peak {human_bytes(p.peak_memory_bytes):>8}  "
                   f"host {human_bytes(host):>8}  {what}  ({a.seconds:5.1f} s to plan)")


def largest(planner: Planner, offload, start: int, known_fit: Attempt | None = None) -> Attempt | None:
    """The attempt at the most layers that plans: double from ``start`` until one fails, then
    bisect between the last fit and the first failure (fitting is monotone in depth)."""
    fit, layers = known_fit, start
    while True:
        a = planner.attempt(layers, offload)
        if a.plan is None:
            break
        fit, layers = a, 2 * layers
    if fit is None:
        return None
    lo, hi = fit.layers, layers
    while hi - lo > 1:
        a = planner.attempt((lo + hi) // 2, offload)
        if a.plan is None:
            hi = a.layers
        else:
            fit, lo = a, a.layers
    return fit


def summary(without: Attempt, with_: Attempt) -> None:
    print(f"\n{'':<18} {'layers':>6} {'params':>9} {'step':>10} {'peak device':>11} {'host':>9}  offload")
    for label, a in (("offload=False", without), ('offload="auto"', with_)):
        p, (host, what) = a.plan.predicted, offload_note(a.plan)
        print(f"{label:<18} {a.layers:>6} {a.params / 1e9:>7.2f} B {human_seconds(p.step_time_s):>10} "
              f"{human_bytes(p.peak_memory_bytes):>11} {human_bytes(host):>9}  {what}")
    print("device memory at the peak, by category:")
    for label, a in (("offload=False", without), ('offload="auto"', with_)):
        parts = "  ".join(f"{SHORT[k]} {human_bytes(v)}" for k, v in a.plan.predicted.memory_bytes.items())
        print(f"  {label:<16} {parts}")
    o = with_.plan.offload
    if o is not None:
        print(f'  offload="auto": fetches {o.fetches}, copies {human_seconds(o.transfer_s)} of which exposed '
              f"{human_seconds(o.exposed_s)}; {optimizer_text(o.optimizer)}; offload adds "
              f"{human_seconds(o.added_s)} to the step")


# ---- 2. against FSDP2's offload-everything policy ----------------------------------------
@dataclass(frozen=True)
class Priced:
    step_s: float
    exposed_s: float  # copies the compute does not hide
    optimizer_s: float
    host_bytes: float  # per device


def fsdp2_offload(plan: autopar.Plan, model, devices: int) -> Priced:
    """FSDP2 with CPUOffloadPolicy, priced in the plan's cost model figures.

    Every parameter is sharded over the ``devices`` (ZeRO-3) and its shard, its gradient and
    its Adam moments live in host memory. Per step each device copies its parameter shards up
    for forward and again for backward (FSDP2 frees them after each use), copies its gradient
    shards down, and steps Adam on the CPU. Counted as:

    - base: the plan's own step time without what its offload adds (its compute, collectives
      and recomputation: FSDP2's all-gathers and reduce-scatters are assumed to cost what the
      plan's collectives cost);
    - copies run over the hardware's host link (bandwidth, plus its latency per parameter
      tensor); where ``host_copies_overlap`` they hide under compute, forward's up-copies under
      forward compute, backward's up- and down-copies (the two directions have their own lanes)
      under backward compute, with compute split 1:2 between forward and backward (recomputation
      runs in backward); otherwise they add in full;
    - the optimizer: every local element through the host's Adam at the node's rate shared by
      its devices (``host_optimizer_rate_per_device``), after backward, hidden under nothing.
    """
    hw = get_hardware(HARDWARE)
    link = hw.host_link
    tensors = sum(1 for _ in model.parameters())
    elements = sum(p.numel() for p in model.parameters()) / devices
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) / devices
    up_s = param_bytes / link.bandwidth + tensors * link.latency
    down_s = up_s  # gradients have the parameters' dtype and shapes
    p = plan.predicted
    plain = p.compute_s - p.recompute_s
    forward_s, backward_s = plain / 3, 2 * plain / 3 + p.recompute_s
    if hw.host_copies_overlap:
        exposed = max(0.0, up_s - forward_s) + max(0.0, max(up_s, down_s) - backward_s)
    else:
        exposed = 2 * up_s + down_s
    optimizer_s = elements / hw.host_optimizer_rate_per_device
    base = p.step_time_s - (plan.offload.added_s if plan.offload is not None else 0.0)
    adam_bytes = 8  # two float32 moments per element
    host = param_bytes * 2 + elements * adam_bytes  # parameters, gradients, moments
    return Priced(base + exposed + optimizer_s, exposed, optimizer_s, host)


def against_fsdp2(planner: Planner, chosen: Attempt, setting: str, label: str) -> None:
    """``chosen`` (planned with offload ``setting``) beside offload=True and FSDP2's policy, at its depth."""
    everything = planner.attempt(chosen.layers, True)
    model, _ = gpt2.make(planner.config(chosen.layers), device="meta")
    fsdp2 = fsdp2_offload(chosen.plan, model, 8)
    host_per_device = get_hardware(HARDWARE).host_memory_per_device
    base = chosen.plan.predicted.step_time_s
    print(f"\n{label}: {chosen.layers} layers, {chosen.params / 1e9:.2f} B parameters "
          f"(host memory per device {human_bytes(host_per_device)})")
    print(f"  {'policy':<34} {'step':>10} {'ratio':>7} {'copies exposed':>14} {'optimizer':>10} {'host':>9}  note")
    rows = [(f"autopar offload={setting}", chosen.plan, "")]
    rows.append(("autopar offload=True", everything.plan, everything.error.split("; ")[-1]))
    for name, plan, error in rows:
        if plan is None:
            print(f"  {name:<34} {'no plan':>10}  {error}")
            continue
        o, step = plan.offload, plan.predicted.step_time_s
        exposed, optimizer, host = (o.exposed_s, o.added_s - o.exposed_s, o.host_bytes) if o else (0.0, 0.0, 0.0)
        print(f"  {name:<34} {human_seconds(step):>10} {step / base:>7.2f} {human_seconds(exposed):>14} "
              f"{human_seconds(optimizer):>10} {human_bytes(host):>9}  {chunks_note(o)}")
    fits = "within" if fsdp2.host_bytes <= host_per_device else "EXCEEDS"
    print(f"  {'FSDP2 CPUOffloadPolicy (priced)':<34} {human_seconds(fsdp2.step_s):>10} {fsdp2.step_s / base:>7.2f} "
          f"{human_seconds(fsdp2.exposed_s):>14} {human_seconds(fsdp2.optimizer_s):>10} "
          f"{human_bytes(fsdp2.host_bytes):>9}  {fits} the device's share of host memory")


# ---- 3. measured on CPU ------------------------------------------------------------------
def cpu_hardware() -> str:
    """"cpu" (the calibrated spec), calibrated here when absent or made before offload's host
    figures existed (it would price host copies as an A100's PCIe link, hidden under compute)."""
    path = calibrated_cpu_path()
    if os.path.exists(path):
        with open(path) as f:
            if "host_link" in json.load(f):
                return "cpu"
    from autopar.cost_models.calibrate import calibrate

    print(f"calibrating this machine (no spec with host figures at {path}) ...", flush=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_hardware(calibrate((2, 4)), path)
    return "cpu"


def measured(rounds: int) -> None:
    hardware = cpu_hardware()
    model, inputs = gpt2.make(CPU_SIZE)
    loose = autopar.plan(model, inputs, mesh=CPU_MESH, hardware=hardware, offload=False, cache=False)
    budget = CPU_BUDGET_SHARE * loose.predicted.peak_memory_bytes
    tight = autopar.plan(model, inputs, mesh=CPU_MESH, hardware=hardware, memory_budget=budget, cache=False)
    plans = {"offload=False, no budget": loose, f"{CPU_BUDGET_SHARE:.0%} budget": tight}
    buffer = io.BytesIO()
    torch.save(model, buffer)
    timed = get_cluster(4).run(time_steps, buffer.getvalue(), inputs, {k: p.to_json() for k, p in plans.items()},
                               rounds)
    cfg = gpt2.SIZES[CPU_SIZE]
    print(f"\n3. measured: GPT-2-style '{CPU_SIZE}' ({cfg.layers} layers, width {cfg.width}, vocabulary {cfg.vocab}, "
          f"batch {cfg.batch} x {cfg.seq}) on {CPU_MESH}, 4 gloo processes, AdamW; planned on the calibrated 'cpu' "
          f"spec; slowest rank's median of {rounds} interleaved rounds; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (the machine is shared)")
    print(f"  {'plan':<26} {'offload':<36} {'peak (pred.)':>12} {'predicted':>10} {'measured':>10} {'meas./pred.':>11}")
    for key, plan in plans.items():
        step = max(statistics.median(rank[key]) for rank in timed)
        print(f"  {key:<26} {chunks_note(plan.offload):<36} {human_bytes(plan.predicted.peak_memory_bytes):>12} "
              f"{human_seconds(plan.predicted.step_time_s):>10} {human_seconds(step):>10} "
              f"{step / plan.predicted.step_time_s:>11.2f}")
    if tight.offload is None:
        print("  (the budgeted plan did not offload: sharding and recomputation met the budget)")


def time_steps(rank, world_size, model_bytes, inputs, plan_jsons: dict, rounds: int) -> dict:
    """Seconds of each plan's AdamW step (forward, backward, optimizer step), the plans taking
    turns within each round so that the shared machine's noise falls on all alike."""
    runs = {}
    for key, plan_json in plan_jsons.items():
        model = torch.load(io.BytesIO(model_bytes), weights_only=False)
        plan = autopar.Plan.from_json(plan_json)
        wrapped = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, example_inputs=inputs)
        wrapped(*inputs)  # distributes the parameters: the optimizer is built on their DTensors
        runs[key] = (wrapped, torch.optim.AdamW(model.parameters(), **ADAMW))
    times = {key: [] for key in runs}
    for i in range(rounds + 1):  # the first round warms up (and creates the optimizer state)
        for key, (wrapped, opt) in runs.items():
            torch.distributed.barrier()
            start = time.perf_counter()
            wrapped(*inputs).backward()
            opt.step()
            opt.zero_grad()
            if i:
                times[key].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver time limit per integer program")
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds (CPU part)")
    parser.add_argument("--skip-search", action="store_true", help="only the CPU measurement")
    parser.add_argument("--skip-measured", action="store_true")
    parser.add_argument("--mesh", default=MESH, help="the mesh of part 1 (pp=8: a pipeline, whose stages "
                                                     "offload whole; part 2 prices flat plans only)")
    args = parser.parse_args()
    start = time.perf_counter()
    ratio = None
    if not args.skip_search:
        planner = Planner(args.width, args.time_limit, args.mesh)
        cfg = planner.config(0)
        print(f"1. largest model: GPT-shaped, width {cfg.width}, {cfg.heads} heads, vocabulary {cfg.vocab}, "
              f"batch {cfg.batch} x {cfg.seq}, float32 parameters, Adam; mesh {args.mesh} of {HARDWARE}, default "
              f"budget; solver limit {args.time_limit:.0f} s")
        without = largest(planner, False, 8)
        with_ = largest(planner, "auto", 2 * without.layers, known_fit=without)
        if with_ is without:  # nothing deeper fits: plan its depth with "auto" for the comparison
            with_ = planner.attempt(without.layers, "auto")
        print(f"{len(planner.attempts)} plans in {planner.seconds:.0f} s")
        summary(without, with_)
        if "pp" not in args.mesh:
            print("\n2. against FSDP2's CPUOffloadPolicy (everything on the host), priced in the same figures")
            against_fsdp2(planner, with_, '"auto"', "largest model with offload")
            against_fsdp2(planner, without, "False", "largest model without offload")
        ratio = with_.params / without.params
    if not args.skip_measured:
        measured(args.rounds)
    print(f"\nwall time {time.perf_counter() - start:.0f} s")
    if ratio is not None:
        print(f"largest model with offload / without: {ratio:.2f}")


if __name__ == "__main__":
    main()
