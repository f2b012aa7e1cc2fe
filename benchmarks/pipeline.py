"""Pipelines: autopar's 3-D plans (pp x dp x tp searched with the stage partition, micro-batch
count and schedule) against Megatron-LM's 3-D layouts, in one cost model.

(a) Every schedule of torch.distributed.pipelining running autopar's stage programs for a
    GPT-2-style decoder on a (pp=2, dp=2) mesh of 4 local CPU processes: predicted step time
    and bubble (on this machine's calibrated CPU spec, ``autopar calibrate``; h100-sxm without
    one) against the measured step time and bubble (the share of each rank's step outside its
    stages' programs), medians of interleaved rounds.
(b) Llama-70B- and GPT-3-175B-shaped models (width, heads, MLP, vocabulary and sequence; depth
    cut to --layers) on 64 H100s (8 nodes) at two global batch sizes: ``autopar.plan(mesh=64)``
    (every 1-D, 2-D and pp x (1-D, 2-D) mesh whose stages hold whole nodes) against the best of
    every layout ``autopar.baselines`` returns (1-D data parallel and ZeRO-3, 2-D Megatron TP with
    and without sequence parallelism and FSDP, and the Megatron 3-D layouts
    ``megatron-pp{p}-tp8-1f1b`` / ``-interleaved``: equal runs of layers, one sample per dp rank
    in a micro-batch), naming the one that won, and against the best 3-D one alone, with each
    row's search time. Every solve stops at a deterministic work limit (the same plans on any
    machine under any load).

(c) A torchtitan-style training loop for a Hugging Face Llama on 4 CPU processes, every
    feature on (built on the meta device and initialized by rank 0 module by module, local
    batches, keyword calls, bf16-mixed, AdamW, two micro-batches accumulated under no_sync,
    global clipping), one model on pp=2,dp=2 and one on dp=2,tp=2 in the same processes:
    each one's measured step time (medians of interleaved rounds) against the other's and
    against its plan's prediction.

Last line: ``worst auto/best-baseline ratio: X.XX``.

    python benchmarks/pipeline.py [--models llama-70b,gpt3-175b] [--batches 16,64] [--layers 8] [--work-limit 40000]
                                  [--rounds 5] [--skip-3d] [--skip-loop]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.baseline_plans import best  # noqa: E402
from autopar.capture.export import capture  # noqa: E402
from autopar.cost_models.hardware import calibrated_cpu_path  # noqa: E402
from autopar.cost_models.pipeline_schedules import SCHEDULES  # noqa: E402
from autopar.planning.pipeline import plan_captured  # noqa: E402
from autopar.runtime.local_cluster import get_cluster  # noqa: E402
from benchmarks.plan_quality import build  # noqa: E402
from examples import gpt2  # noqa: E402

CPU_MODEL = gpt2.GPT2Config(vocab=2048, seq=128, layers=4, heads=8, width=512, batch=8)
CPU_MESH, CPU_MICROBATCHES = "pp=2,dp=2", 4


def schedules_on_cpu(rounds: int) -> None:
    hardware = "cpu" if os.path.exists(calibrated_cpu_path()) else "h100-sxm"
    model, inputs = gpt2.make(CPU_MODEL)
    plans = {name: autopar.plan(model, inputs, mesh=CPU_MESH, hardware=hardware, schedule=name,
                                microbatches=CPU_MICROBATCHES, cache=False) for name in SCHEDULES}
    buffer = io.BytesIO()
    torch.save(model, buffer)
    timed = get_cluster(4).run(_time_schedules, buffer.getvalue(), inputs, {k: p.to_json() for k, p in plans.items()},
                               rounds)
    print(f"(a) GPT-2-style decoder ({CPU_MODEL.layers} layers, width {CPU_MODEL.width}, batch {CPU_MODEL.batch}), "
          f"mesh ({CPU_MESH}), {CPU_MICROBATCHES} micro-batches, on 4 CPU processes; predicted on {hardware}"
          + ("" if hardware == "cpu" else " (run `autopar calibrate` for this machine's spec)")
          + f"; medians of {rounds} interleaved rounds")
    print(f"  {'schedule':<22} {'v':>2} {'predicted':>10} {'bubble':>7} {'measured':>10} {'bubble':>7} "
          f"{'meas/pred':>9}")
    for name, plan in plans.items():
        walls = [statistics.median(rank[name]["wall"]) for rank in timed]
        wall = max(walls)  # the step ends when its slowest rank does
        bubble = statistics.mean(1 - statistics.median(b / w for b, w in zip(rank[name]["busy"], rank[name]["wall"]))
                                 for rank in timed)
        pl = plan.pipeline
        print(f"  {name:<22} {pl.virtual:>2} {pl.step_time_s * 1e3:>8.2f}ms {pl.bubble_fraction:>7.1%} "
              f"{wall * 1e3:>8.2f}ms {bubble:>7.1%} {wall / pl.step_time_s:>9.2f}")
    print("  measured bubble: the share of each rank's step spent outside its stages' programs (P2P waits and "
          "bubbles), averaged over the ranks; 4 processes share this machine's cores, so a stage's programs run "
          "slower while the other ranks compute")


def _time_schedules(rank, world_size, model_bytes, inputs, plan_jsons: dict, rounds: int) -> dict:
    """Every schedule's pipelined module built once, then ``rounds`` rounds of one timed step
    each, in turn: per schedule, each step's wall time and this rank's busy time."""
    import torch.distributed as dist

    from autopar.check import rank_mesh_for
    from autopar.ir.plan import Plan
    from autopar.runtime.pipeline import PipelinedModule

    modules = {}
    for name, text in plan_jsons.items():
        plan = Plan.from_json(text)
        model = torch.load(io.BytesIO(model_bytes), weights_only=False)
        modules[name] = PipelinedModule(model, plan, rank_mesh_for(plan.mesh, plan.pipeline.pp), plan.emit("torch"))
        modules[name](*inputs).backward()  # warm-up
    out = {name: {"wall": [], "busy": []} for name in modules}
    for _ in range(rounds):
        for name, module in modules.items():
            module.take_busy_seconds()
            dist.barrier()
            start = time.perf_counter()
            module(*inputs).backward()
            dist.barrier()
            out[name]["wall"].append(time.perf_counter() - start)
            out[name]["busy"].append(module.take_busy_seconds())
    return out


LOOP_MESHES = ("pp=2,dp=2", "dp=2,tp=2")
LOOP_ACCUMULATE = 2  # micro-batches of the loop's step, the first under no_sync


def training_loop_on_cpu(rounds: int) -> None:
    hardware = "cpu" if os.path.exists(calibrated_cpu_path()) else "h100-sxm"
    timed = get_cluster(4).run(_time_training_loops, hardware, rounds)
    print(f"\n(c) Hugging Face Llama (2 layers, width 256, batch 8 x 64 tokens per call, {LOOP_ACCUMULATE} calls per "
          f"step), every feature on, on 4 CPU processes; predicted on {hardware}; medians of {rounds} interleaved "
          f"rounds")
    print(f"  {'mesh':<12} {'predicted':>10} {'measured':>10} {'meas/pred':>9} {'vs dp=2,tp=2':>12}")
    flat = statistics.median(timed[0]["wall"]["dp=2,tp=2"])
    for mesh in LOOP_MESHES:
        wall = statistics.median(max(rank["wall"][mesh][i] for rank in timed) for i in range(rounds))
        predicted = timed[0]["predicted"][mesh] * LOOP_ACCUMULATE
        print(f"  {mesh:<12} {predicted * 1e3:>8.2f}ms {wall * 1e3:>8.2f}ms {wall / predicted:>9.2f} "
              f"{wall / flat:>12.2f}")


def _time_training_loops(rank, world_size, hardware: str, rounds: int) -> dict:
    """Both meshes' models built and warmed up, then ``rounds`` rounds of one timed step each,
    in turn: per mesh, each step's wall time, and its plan's predicted time per call."""
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1024, max_position_embeddings=64, use_cache=False)
    tokens = torch.randint(0, 1024, (8, 64), generator=torch.Generator().manual_seed(0))
    loops = {}
    for mesh in LOOP_MESHES:
        torch.manual_seed(0)
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        model = autopar.autoparallelize(model, mesh=mesh, hardware=hardware, inputs="local", init=model._init_weights,
                                        precision="bf16-mixed")
        block, blocks = autopar.data_parallel_info(model)
        local = tokens.chunk(blocks)[block]
        autopar.prepare(model, input_ids=local, labels=local)
        loops[mesh] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3), local)
        _loop_step(*loops[mesh])  # warm-up
    out = {"wall": {mesh: [] for mesh in loops}, "predicted": {}}
    for mesh, (model, _, _) in loops.items():
        plan = autopar.plan_of(model)
        out["predicted"][mesh] = plan.pipeline.step_time_s if plan.pipeline else plan.predicted.step_time_s
    for _ in range(rounds):
        for mesh, loop in loops.items():
            dist.barrier()
            start = time.perf_counter()
            _loop_step(*loop)
            dist.barrier()
            out["wall"][mesh].append(time.perf_counter() - start)
    return out


def _loop_step(model, opt, tokens) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a pipeline returns the loss alone: logits come back None
        for k in range(LOOP_ACCUMULATE):
            with model.no_sync() if k < LOOP_ACCUMULATE - 1 else contextlib.nullcontext():
                (model(input_ids=tokens, labels=tokens).loss / LOOP_ACCUMULATE).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()


def three_d_rows(models, batches, layers: int, work_limit: int) -> float:
    print(f"\n(b) 64 x h100-sxm (8 nodes), {layers} layers per model, Adam, budget 90% of 80 GB; predicted step times")
    print(f"  {'model':<10} {'batch':>5} {'auto mesh':<22} {'schedule':<26} {'auto':>10} {'best baseline':<30} "
          f"{'baseline':>10} {'ratio':>6} {'best 3-D':>10} {'ratio':>6} {'search':>7}")
    worst = 0.0
    for name in models:
        for batch in batches:
            model, inputs, heads = build(name, layers, batch)
            program = capture(model, inputs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                start = time.perf_counter()
                auto = plan_captured(program, model, inputs, mesh=64, hardware="h100-sxm",
                                     solver_work_limit=work_limit)
                searched = time.perf_counter() - start
                plans = autopar.baselines(model, inputs, devices=64, hardware="h100-sxm", heads=heads,
                                          program=program, solver_work_limit=work_limit)
            three_d = {k: p for k, p in plans.items() if p.pipeline is not None}
            pl = auto.pipeline
            schedule = f"{pl.schedule} m={pl.microbatches}" + (f" v={pl.virtual}" if pl.virtual > 1 else "") \
                if pl else "-"
            row = f"  {name:<10} {batch:>5} {str(auto.device_mesh):<22} {schedule:<26} " \
                  f"{auto.predicted.step_time_s * 1e3:>8.1f}ms "
            if not plans:
                print(row + "no baseline fits: " + "; ".join(f"{k}: {v[:60]}" for k, v in plans.skipped.items()))
                continue
            base_name, base = best(plans)
            ratio = auto.predicted.step_time_s / base.predicted.step_time_s
            worst = max(worst, ratio)
            if three_d:
                _, three_d_best = best(three_d)
                versus_3d = (f"{three_d_best.predicted.step_time_s * 1e3:>8.1f}ms "
                             f"{auto.predicted.step_time_s / three_d_best.predicted.step_time_s:>6.3f}")
            else:
                versus_3d = f"{'none fits':>10} {'-':>6}"
            print(row + f"{base_name:<30} {base.predicted.step_time_s * 1e3:>8.1f}ms {ratio:>6.3f} {versus_3d} "
                  f"{searched:>6.0f}s", flush=True)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama-70b,gpt3-175b")
    parser.add_argument("--batches", default="16,64", help="global batch sizes, in sequences")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--work-limit", type=int, default=40_000,
                        help="the solver's deterministic work limit per solve (autopar.solvers.limits)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of every schedule in (a)")
    parser.add_argument("--skip-3d", action="store_true", help="leave (b) out")
    parser.add_argument("--skip-loop", action="store_true", help="leave (c) out")
    args = parser.parse_args()
    schedules_on_cpu(args.rounds)
    if not args.skip_loop:
        training_loop_on_cpu(args.rounds)
    if args.skip_3d:
        return
    worst = three_d_rows(args.models.split(","), [int(b) for b in args.batches.split(",")], args.layers,
                         args.work_limit)
    print(f"worst auto/best-baseline ratio: {worst:.2f}")


if __name__ == "__main__":
    main()
