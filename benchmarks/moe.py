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

Not yet here: (b) autopar's expert-parallel program against a hand-written one on 4 CPU
processes (issue 47 keeps it open).

Last line: ``worst auto/best-moe-baseline ratio: X.XX``.

    python benchmarks/moe.py [--models mixtral-8x7b,deepseek-v3] [--batches 8,32] [--layers 4]
                             [--devices 64] [--work-limit 40000]
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
from autopar.baseline_plans import best  # noqa: E402
from autopar.ops.moe import MOE_FORWARD, layout_text  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mixtral-8x7b,deepseek-v3")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--work-limit", type=int, default=40_000)
    args = ap.parse_args()
    print(f"(a) {args.layers} layers, sequence {SEQ}, {args.devices} x h100-sxm; step times in ms")
    print(f"{'model':<13} {'batch':>5} {'auto mesh':<22} {'auto':>9} {'best baseline':<22} {'its step':>9} "
          f"{'ratio':>6} {'search':>8}  MoE layouts")
    ratios = [row(m, int(b), args.layers, args.devices, args.work_limit)
              for m in args.models.split(",") for b in args.batches.split(",")]
    print(f"worst auto/best-moe-baseline ratio: {max(ratios):.2f}")


if __name__ == "__main__":
    main()
