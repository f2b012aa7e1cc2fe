"""Mixture of experts: autopar's plans against torchtitan- and Megatron-style MoE layouts, in
one cost model.

(a) Mixtral-8x7B- and DeepSeek-V3-shaped models (widths, expert counts, top-k and vocabulary
    real; depth cut to --layers) on --devices H100s at two global batch sizes:
    ``autopar.plan(mesh=N)`` (every mesh of N devices searched, expert parallelism among each
    MoE layer's layouts) against the best of every layout ``autopar.baselines`` returns: the
    dense ones (DP, ZeRO-3, Megatron TP with SP and FSDP, the 3-D ones past a node) with their
    experts whole or gathered per use, and the expert-parallel ones (``zero3-ep``: torchtitan's
    FSDP with EP over every device; ``megatron-tp{t}-ep[-sp]``: Megatron-Core's dense TP with
    EP over dp), naming the one that won and how each plan lays out its MoE layers, with each
    row's search time. Every solve stops at a deterministic work limit.

(b) A small Mixtral-style model on 4 local CPU processes (gloo), its experts split over them:
    autopar's expert-parallel program against a hand-written expert-parallel step
    (benchmarks/moe_by_hand.py: the dense part data parallel, the same all-to-all dispatch
    with torch's ``all_to_all_single``), SGD steps in interleaved rounds; each figure is the
    median over rounds of the slowest rank's median step. Their first losses are printed beside.

Last line: ``worst auto/best-moe-baseline ratio: X.XX`` (both parts).

    python benchmarks/moe.py [--models mixtral-8x7b,deepseek-v3] [--batches 8,32] [--layers 4]
                             [--devices 64] [--work-limit 40000] [--rounds 3] [--steps 5] [--skip-64]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.baseline_plans import BatchOverDataParallel, ExpertLayout, best, expert_parameters  # noqa: E402
from autopar.ops.moe import MOE_FORWARD, layout_text, splits_experts  # noqa: E402
from examples import hf_zoo  # noqa: E402

SEQ = 4096


def mixtral_8x7b(batch: int, layers: int):
    return hf_zoo.mixtral(batch=batch, seq=SEQ, width=4096, heads=32, kv_heads=8, layers=layers, vocab=32000,
                          experts=8, intermediate=14336)


def deepseek_v3(batch: int, layers: int):
    """DeepSeek-V3's widths: 256 routed experts of 2048, top-8, one shared expert, latent
    attention; its first layer dense (it has three; one here, as depth is cut)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=layers,
        num_attention_heads=128, num_key_value_heads=128, vocab_size=129280, max_position_embeddings=SEQ,
        n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
        first_k_dense_replace=1, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128)
    ids = torch.zeros(batch, SEQ, dtype=torch.long)
    return hf_zoo.LossOf(DeepseekV3ForCausalLM(cfg)), (ids, ids)


MODELS = {"mixtral-8x7b": mixtral_8x7b, "deepseek-v3": deepseek_v3}


def moe_layouts(plan) -> str:
    """How a plan lays out its MoE layers: each layout with its count of layers."""
    counts: dict[str, int] = {}
    for n in plan.graph.nodes:
        if n.target == MOE_FORWARD:
            text = layout_text(plan.strategies[n.name].in_specs, plan.mesh.axis_names).split(" (")[0]
            counts[text] = counts.get(text, 0) + 1
    return "; ".join(f"{k} x{v}" for k, v in counts.items()) or "-"


def row(name: str, batch: int, layers: int, devices: int, work_limit: int) -> float:
    with torch.device("meta"):
        model, inputs = MODELS[name](batch, layers)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = autopar.plan(model, inputs, mesh=devices, hardware="h100-sxm", solver_work_limit=work_limit,
                            cache=False)
    searched = time.perf_counter() - start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plans = autopar.baselines(model, inputs, devices=devices, hardware="h100-sxm", solver_work_limit=work_limit)
    winner, baseline = best(plans)
    ratio = auto.predicted.step_time_s / baseline.predicted.step_time_s
    print(f"{name:<13} {batch:>5} {str(auto.device_mesh):<22} {auto.predicted.step_time_s * 1e3:>9.1f} "
          f"{winner:<22} {baseline.predicted.step_time_s * 1e3:>9.1f} {ratio:>6.3f} {searched:>7.1f}s  "
          f"auto: {moe_layouts(auto)} | {winner}: {moe_layouts(baseline)}")
    return ratio


def on_cpu(rounds: int, steps: int) -> float:
    """(b): autopar's EP program / the hand-written one, measured."""
    from autopar.cost_models.hardware import calibrated_cpu_path
    from benchmarks.against_by_hand import autopar_against_by_hand, print_ratio
    from benchmarks.moe_by_hand import train_by_hand

    torch.manual_seed(0)
    batch_size, seq = 8, 64
    model, batch = hf_zoo.mixtral(batch=batch_size, seq=seq, width=128, heads=4, kv_heads=2, layers=2, vocab=1024,
                                  experts=4)
    # the hand-written step's layout, given to the planner: the dense part data parallel (its
    # parameters whole, every batch-carrying activation split), the experts split
    experts = expert_parameters(model)
    pin = {n: "S(0)" if n in experts else "R" for n, _ in model.named_parameters()}
    layout = [BatchOverDataParallel(frozenset({batch_size, batch_size * seq}), axis="ep"), ExpertLayout("ep")]
    hardware = calibrated_cpu_path() if os.path.exists(calibrated_cpu_path()) else "h100-sxm"
    plan = autopar.plan(model, batch, mesh="ep=4", hardware=hardware, pin=pin, passes=layout, cache=False)
    if not splits_experts(plan):
        raise SystemExit(f"the plan on {hardware} keeps the experts whole ({moe_layouts(plan)}): nothing to compare")
    measured = autopar_against_by_hand(model, batch, plan, train_by_hand, rounds, steps)
    print(f"\n(b) 4 CPU processes, {moe_layouts(plan)} on {hardware}; median SGD step over {rounds} rounds")
    return print_ratio(measured)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mixtral-8x7b,deepseek-v3")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--work-limit", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--skip-64", action="store_true", help="only part (b)")
    args = ap.parse_args()
    ratios = []
    if not args.skip_64:
        print(f"(a) {args.layers} layers, sequence {SEQ}, {args.devices} x h100-sxm; step times in ms")
        print(f"{'model':<13} {'batch':>5} {'auto mesh':<22} {'auto':>9} {'best baseline':<22} {'its step':>9} "
              f"{'ratio':>6} {'search':>8}  MoE layouts")
        ratios += [row(m, int(b), args.layers, args.devices, args.work_limit)
                   for m in args.models.split(",") for b in args.batches.split(",")]
    ratios.append(on_cpu(args.rounds, args.steps))
    print(f"worst auto/best-moe-baseline ratio: {max(ratios):.2f}")


if __name__ == "__main__":
    main()
