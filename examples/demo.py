"""Demo: plan a GPT-2-style decoder for a (dp=2, tp=2) mesh of H100s, print the plan,
then run 3 training steps of the emitted program on 4 local CPU processes and
compare each loss with single-process PyTorch.

    python examples/demo.py [--size demo|small|tiny] [--mesh dp=2,tp=2] [--steps 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from examples import gpt2  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="demo", choices=sorted(gpt2.SIZES))
    parser.add_argument("--mesh", default="dp=2,tp=2")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    model, inputs = gpt2.make(args.size)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT-2-style decoder '{args.size}': {gpt2.SIZES[args.size]}, {n_params / 1e6:.1f} M parameters")
    start = time.perf_counter()
    plan = autopar.plan(model, inputs, mesh=args.mesh, hardware=args.hardware, verbose=True)
    print(f"planned in {time.perf_counter() - start:.1f} s\n")
    print(plan.summary())

    mesh = autopar.Mesh.parse(args.mesh)
    print(f"\nrunning {args.steps} SGD steps on {mesh.size} local CPU processes (gloo) ...")
    start = time.perf_counter()
    report = autopar.check(model, inputs, plan=plan, steps=args.steps)
    print(f"ran in {time.perf_counter() - start:.1f} s\n")
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
