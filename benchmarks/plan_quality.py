"""Plan quality: autopar's plan vs the best hand-written baseline, in one cost model.

For GPT-3 1.3B/6.7B/13B- and Llama-3 8B/70B-shaped models (their width, heads, MLP,
vocabulary and sequence; depth cut to --layers, since clustered layers solve like one)
on 8 and 64 H100s, at two global batch sizes, each row plans:

- auto: `autopar.plan(mesh=N)`: every 1-D and 2-D mesh that respects node boundaries;
- the baselines of `autopar.baselines` (data parallel, ZeRO-3, Megatron TP x DP with and
  without sequence parallelism and FSDP on dp), each a pinned plan through the same passes,

all under the same memory budget (90% of 80 GB, Adam), and prints the predicted step times,
auto / best-baseline (target <= 1.00), and the solver's proven gap on auto's mesh. A row where
no layout fits the budget says so and does not count; one where only autopar finds none counts
as infinitely worse. Last line: `worst auto/best-baseline ratio: X.XX`.

    python benchmarks/plan_quality.py [--models gpt3-1.3b,llama-8b] [--devices 8,64] [--layers 4] [--time-limit 120]

The time limit is per integer program. The full programs of the 2-D Llama rows on 64 GPUs
(about 210k booleans; mesh search runs them on the finalist meshes only) take 40-95 s to
prove on a 2-core machine; under a 10 s limit they are skipped and those rows have no bound.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.baseline_plans import best  # noqa: E402
from autopar.capture.export import capture  # noqa: E402
from autopar.planning.pipeline import plan_captured  # noqa: E402
from examples import gpt2  # noqa: E402
from examples.hf_zoo import LossOf  # noqa: E402

# name: (kind, width, heads, kv heads, mlp width, vocab, sequence)
MODELS = {
    "gpt3-1.3b": ("gpt", 2048, 16, 16, 4 * 2048, 51200, 2048),
    "gpt3-6.7b": ("gpt", 4096, 32, 32, 4 * 4096, 51200, 2048),
    "gpt3-13b": ("gpt", 5120, 40, 40, 4 * 5120, 51200, 2048),
    "gpt3-175b": ("gpt", 12288, 96, 96, 4 * 12288, 51200, 2048),
    "llama-8b": ("llama", 4096, 32, 8, 14336, 128256, 4096),
    "llama-70b": ("llama", 8192, 64, 8, 28672, 128256, 4096),
}


def build(name: str, layers: int, batch: int):
    kind, width, heads, kv_heads, mlp, vocab, seq = MODELS[name]
    with torch.device("meta"):
        if kind == "gpt":
            model = gpt2.GPT2(gpt2.GPT2Config(vocab=vocab, seq=seq, layers=layers, heads=heads, width=width,
                                              batch=batch))
        else:
            from transformers import LlamaConfig, LlamaForCausalLM

            model = LossOf(LlamaForCausalLM(LlamaConfig(
                hidden_size=width, intermediate_size=mlp, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=seq)))
        ids = torch.empty(batch, seq, dtype=torch.long)
    return model, (ids, ids), heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(m for m in MODELS if m != "gpt3-175b"))
    parser.add_argument("--devices", default="8,64")
    parser.add_argument("--batches", default="16,128", help="global batch sizes, in sequences")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--time-limit", type=float, default=120.0, help="solver time limit per integer program")
    args = parser.parse_args()

    print(f"{args.layers} layers per model, h100-sxm, Adam, memory budget 90% of 80 GB; step times predicted")
    print(f"{'model':<10} {'GPUs':>4} {'batch':>5} {'auto mesh':<15} {'auto':>10} {'best baseline':<24} "
          f"{'baseline':>10} {'ratio':>6} {'gap':>6} {'time':>6}")
    worst = 0.0
    for name in args.models.split(","):
        for devices in (int(d) for d in args.devices.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                start = time.perf_counter()
                model, inputs, heads = build(name, args.layers, batch)
                program = capture(model, inputs)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # gaps are printed
                    try:
                        auto = plan_captured(program, model, inputs, mesh=devices, hardware="h100-sxm",
                                             solver_time_limit_s=args.time_limit)
                    except autopar.AutoparError as exc:  # no mesh fits the budget: do the baselines?
                        auto, auto_error = None, str(exc)
                    plans = autopar.baselines(model, inputs, devices=devices, hardware="h100-sxm", heads=heads,
                                              program=program, solver_time_limit_s=args.time_limit)
                row = f"{name:<10} {devices:>4} {batch:>5} "
                seconds = f"{time.perf_counter() - start:>5.0f}s"
                if not plans:
                    # a row no layout can train within the budget says so and does not count
                    print(row + ("no plan: neither auto nor any baseline fits the memory budget" if auto is None
                                 else f"{str(auto.mesh):<15} {auto.predicted.step_time_s * 1e3:>8.2f}ms, no baseline "
                                      "fits the memory budget") + f" {seconds}", flush=True)
                elif auto is None:  # a baseline fits where autopar found nothing: the worst failure
                    worst = math.inf
                    print(row + f"auto: no plan ({auto_error[:80]}); a baseline fits {seconds}", flush=True)
                else:
                    base_name, base = best(plans)
                    ratio = auto.predicted.step_time_s / base.predicted.step_time_s
                    worst = max(worst, ratio)
                    print(row + f"{str(auto.mesh):<15} {auto.predicted.step_time_s * 1e3:>8.2f}ms "
                          f"{base_name + ' ' + str(base.mesh.shape):<24} {base.predicted.step_time_s * 1e3:>8.2f}ms "
                          f"{ratio:>6.3f} {auto.solver.gap:>6.1%} {seconds}", flush=True)
                for skipped, why in sorted(plans.skipped.items()):
                    print(f"{'':<10} no {skipped} plan: {why[:110]}")
    print(f"worst auto/best-baseline ratio: {worst:.2f}")


if __name__ == "__main__":
    main()
