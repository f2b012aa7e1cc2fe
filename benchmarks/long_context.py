"""Long contexts: autopar's context-parallel plans and programs against hand-set configurations.

(a) Llama-3-8B-shaped models (widths, heads and vocabulary real; depth cut to --layers) with
    one sequence of 32k, 131k or 262k tokens on --devices H100s: ``autopar.plan`` on a 1-D mesh
    of them (the solver free to split the sequence, the heads, the parameters, to recompute and
    to offload) against torchtitan's documented context-parallel configuration on 8 GPUs,
    FSDP x CP8 (its ``dp_shard`` of 1: the parameters sharded over the cp axis) with the
    sequence split in every attention, priced by the same cost model (the parameters pinned
    ``S(0)``, attention's sequence pinned to the axis, the rest solved). Each row gives both
    steps and peaks, and where one of them does not fit.

(b) A Llama-style model (grouped-query attention, rotary positions; 2 layers, width 256) with
    one sequence of 4,096 tokens on 4 local CPU processes (gloo), its sequence split over them:
    autopar's program against a hand-written all-gather-KV step
    (benchmarks/long_context_by_hand.py), SGD steps in interleaved rounds; each figure is the
    median over rounds of the slowest rank's median step. Their first losses are printed
    beside. torch's own ``context_parallel`` is not the baseline: it runs its ring attention
    through DTensor's dispatch of the CUDA flash and efficient kernels.

Last line: ``worst auto/best-cp-baseline ratio: X.XX`` (both parts; (a) where both fit).

    python benchmarks/long_context.py [--seqs 32768,131072,262144] [--layers 4] [--devices 8]
                                      [--rounds 3] [--steps 5] [--skip-gpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.baseline_plans import SequenceSplit  # noqa: E402
from autopar.ops.attention import query_spec, sequence_axis  # noqa: E402
from autopar.units import human_bytes  # noqa: E402
from examples.hf_zoo import llama3_shaped  # noqa: E402


def split_axes(plan) -> str:
    """The axes the plan's attention calls split their sequence over, or "-"."""
    axes = {sequence_axis(query_spec(n.target, plan.strategies[n.name].in_specs)) for n in plan.graph.nodes
            if "scaled_dot_product" in n.target}
    named = sorted(plan.mesh.axis_names[a] for a in axes if a is not None)
    return ",".join(named) or "-"


def _plan(model, inputs, mesh: str, **options):
    """The plan, or the reason none fits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            return autopar.plan(model, inputs, mesh=mesh, hardware="h100-sxm", optimizer="adam-mixed", cache=False,
                                **options)
        except autopar.AutoparError as exc:
            return str(exc).splitlines()[0][:60]


def row(seq: int, layers: int, devices: int) -> float | None:
    model, inputs = llama3_shaped("8b", batch=1, seq=seq, layers=layers)
    auto = _plan(model, inputs, f"dp={devices}")
    pin = {name: "S(0)" for name, _ in model.named_parameters()}
    torchtitan = _plan(model, inputs, f"cp={devices}", pin=pin, passes=[SequenceSplit("cp")])
    cells, ratio = [], None
    for plan in (auto, torchtitan):
        if isinstance(plan, str):
            cells.append(f"{'no plan: ' + plan:<40}")
        else:
            p = plan.predicted
            cells.append(f"{p.step_time_s:>8.3f} s {human_bytes(p.peak_memory_bytes):>9} split {split_axes(plan):<4}"
                         f"{' offload' if plan.offload is not None else '':<8}")
    if not isinstance(auto, str) and not isinstance(torchtitan, str):
        ratio = auto.predicted.step_time_s / torchtitan.predicted.step_time_s
    print(f"{seq:>7} {cells[0]}  {cells[1]}  {'-' if ratio is None else f'{ratio:.2f}':>6}")
    if isinstance(auto, str) and not isinstance(torchtitan, str):
        return float("inf")  # a configuration fits where autopar found nothing
    return ratio


def on_cpu(rounds: int, steps: int) -> float:
    """(b): autopar's context-parallel program / the hand-written one, measured."""
    from autopar.cost_models.hardware import calibrated_cpu_path
    from benchmarks.against_by_hand import autopar_against_by_hand, print_ratio
    from benchmarks.long_context_by_hand import LlamaStyle, train_by_hand

    torch.manual_seed(0)
    seq, vocab = 4096, 1024
    model = LlamaStyle(vocab=vocab)
    batch = (torch.randint(0, vocab, (1, seq)), torch.randint(0, vocab, (1, seq)), torch.arange(seq))
    # the hand-written step's layout, given to the planner: every parameter whole, the
    # sequence split in every attention (and wherever else the solver finds it cheapest)
    pin = {name: "R" for name, _ in model.named_parameters()}
    hardware = calibrated_cpu_path() if os.path.exists(calibrated_cpu_path()) else "h100-sxm"
    plan = autopar.plan(model, batch, mesh="cp=4", hardware=hardware, pin=pin, passes=[SequenceSplit("cp")],
                        cache=False)
    measured = autopar_against_by_hand(model, batch, plan, train_by_hand, rounds, steps)
    print(f"\n(b) 4 CPU processes, {seq} tokens, sequence split over {split_axes(plan)} on {hardware}; "
          f"median SGD step over {rounds} rounds")
    return print_ratio(measured)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="32768,131072,262144")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--skip-gpu", action="store_true", help="only part (b)")
    args = ap.parse_args()
    ratios = []
    if not args.skip_gpu:
        print(f"(a) Llama-3-8B-shaped, {args.layers} layers, one sequence, {args.devices} x h100-sxm, adam-mixed")
        print(f"{'tokens':>7} {'autopar: step, peak, split':<40}  {'torchtitan FSDPxCP: step, peak, split':<40}  "
              f"{'ratio':>6}")
        ratios += [r for r in (row(int(s), args.layers, args.devices) for s in args.seqs.split(",")) if r is not None]
    ratios.append(on_cpu(args.rounds, args.steps))
    print(f"worst auto/best-cp-baseline ratio: {max(ratios):.2f}")


if __name__ == "__main__":
    main()
