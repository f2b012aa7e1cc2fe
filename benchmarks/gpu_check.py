"""The GPU check: autopar's emitted programs on a real device, against eager PyTorch.

    bash benchmarks/gpu_check.sh                 # on a machine with a GPU (under 8 minutes on one H200)
    python benchmarks/gpu_check.py --device cpu --sizes tiny --no-compile   # the same script on the CPU

For each model (GPT-2-124M, and a Llama-3.2-1B-shaped decoder from a config), on a mesh of
size 1 in bf16-mixed, planned for ``--hardware`` (default h200-sxm):

- one training step of the emitted program against eager under torch.autocast: the loss and
  every gradient at autopar.check's bf16 tolerance;
- step time (forward, backward, SGD) of the emitted program, eager, torch.compile(eager) and
  the emitted program with compile=True;
- measured peak memory of the program's step against the plan's prediction (SGD: no optimizer
  state), and predicted against measured step time, in total and per op class (matmul,
  attention, the rest), from torch.profiler's device times.

Last line: `gpu check: OK` when every comparison is within tolerance, else `gpu check: MISMATCH`.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import autopar  # noqa: E402
from autopar.check import MIXED_TOLERANCE, compare  # noqa: E402
from autopar.runtime.state import whole  # noqa: E402
from examples import gpt2  # noqa: E402

TOLERANCE = MIXED_TOLERANCE["bfloat16"]
MATMUL = ("mm", "addmm", "bmm", "matmul", "linear", "gemm", "cutlass", "sm90", "ampere")
ATTENTION = ("attention", "flash", "fmha", "efficient")


def make(size: str, device: str):
    """(model, (inputs, targets)) in float32 on ``device``."""
    torch.manual_seed(0)
    if size == "llama-1b":
        from transformers import LlamaConfig, LlamaForCausalLM

        from examples.hf_zoo import LossOf

        config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=1024, use_cache=False)
        model = LossOf(LlamaForCausalLM(config))
        tokens = torch.randint(0, config.vocab_size, (2, 1024))
        return model.to(device), (tokens.to(device), tokens.to(device))
    model, batch = gpt2.make(size)
    return model.to(device), tuple(x.to(device) for x in batch)


def timed(step, device: str, steps: int) -> float:
    times = []
    for _ in range(steps + 1):  # the first warms up (and compiles)
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def sgd_step(model, batch, autocast: bool, device: str):
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            loss = model(*batch)
        loss.backward()
        opt.step()
        return loss
    return step


def op_class(name: str) -> str:
    lowered = name.lower()
    if any(k in lowered for k in ATTENTION):
        return "attention"
    if any(k in lowered for k in MATMUL):
        return "matmul"
    return "other"


def predicted_by_class(plan) -> dict:
    out = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for node in plan.graph.nodes:
        if node.op == "call" and node.name in plan.strategies:
            out[op_class(node.target.removeprefix("aten."))] += plan.strategies[node.name].compute_s
    return out


def measured_by_class(step, device: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device.startswith("cuda") else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    out = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        seconds = (event.device_time_total if device.startswith("cuda") else event.self_cpu_time_total) / 1e6
        if event.key.startswith("aten::") or device.startswith("cuda"):
            out[op_class(event.key)] += seconds
    return out


def check_size(size: str, args) -> bool:
    device = args.device
    model, batch = make(size, device)
    reference = copy.deepcopy(model)
    want = sgd_step(reference, batch, True, device)
    ref_loss = want().item()
    ref_grads = {n: p.grad.detach().clone() for n, p in reference.named_parameters() if p.grad is not None}
    parallel = autopar.autoparallelize(copy.deepcopy(model), mesh={"dp": 1}, hardware=args.hardware,
                                       precision="bf16-mixed", device=device, example_inputs=batch)
    plan = autopar.plan_of(parallel)
    got = sgd_step(parallel, batch, False, device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    loss = got().item()
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else float("nan")
    checks = [compare("loss", torch.tensor(loss), torch.tensor(ref_loss), TOLERANCE)]
    checks += [compare(f"grad {n}", whole(p.grad), ref_grads[n], TOLERANCE) for n, p in parallel.named_parameters()
               if n in ref_grads]
    bad = [c for c in checks if not c.ok]
    print(f"{size}: plan {plan.hash}, loss {loss:.6f} vs eager {ref_loss:.6f}; {len(checks) - 1} gradients, worst rel "
          f"error {max(c.max_rel_error for c in checks):.2e} (tolerance {TOLERANCE[0]:g}): "
          f"{'OK' if not bad else 'MISMATCH ' + ', '.join(c.name for c in bad[:5])}", flush=True)
    times = {"emitted program": timed(got, device, args.steps), "eager": timed(want, device, args.steps)}
    if not args.no_compile:
        compiled = copy.deepcopy(model)
        compiled.forward = torch.compile(compiled.forward)
        times["torch.compile(eager)"] = timed(sgd_step(compiled, batch, True, device), device, args.steps)
        program = autopar.autoparallelize(copy.deepcopy(model), mesh={"dp": 1}, hardware=args.hardware, plan=plan,
                                          device=device, compile=True, example_inputs=batch)
        times["emitted program, compiled"] = timed(sgd_step(program, batch, False, device), device, args.steps)
    for name, seconds in times.items():
        print(f"  {name:<28} {seconds * 1e3:9.2f} ms per step")
    sgd = autopar.plan(model, batch, mesh={"dp": 1}, hardware=args.hardware, precision="bf16-mixed", optimizer="sgd")
    print(f"  peak memory: measured {peak / 2**30:.2f} GiB, predicted {sgd.predicted.peak_memory_bytes / 2**30:.2f} GiB"
          f" (SGD)")
    predicted, measured = predicted_by_class(plan), measured_by_class(got, device)
    print(f"  step time: predicted {plan.predicted.step_time_s * 1e3:.2f} ms on {plan.hardware}, measured "
          f"{times['emitted program'] * 1e3:.2f} ms")
    for name in predicted:
        print(f"    {name:<10} predicted {predicted[name] * 1e3:8.2f} ms, measured {measured[name] * 1e3:8.2f} ms")
    return not bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="gpt2-124m,llama-1b")
    parser.add_argument("--hardware", default="h200-sxm")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (of eager and of the program)")
    args = parser.parse_args()
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo", rank=0, world_size=1)
    ok = all([check_size(size, args) for size in args.sizes.split(",")])
    print(f"gpu check: {'OK' if ok else 'MISMATCH'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
