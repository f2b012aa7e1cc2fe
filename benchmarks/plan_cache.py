"""A first and a cached second `autopar.plan` of the GPT-2-style decoder.

    python benchmarks/plan_cache.py [--size small] [--mesh dp=2,tp=2]

The second call captures the step again (the cache key needs the graph's fingerprint)
and loads the plan instead of running the passes. Both use a fresh cache directory.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.capture.export import capture  # noqa: E402
from examples import gpt2  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", choices=sorted(gpt2.SIZES))
    parser.add_argument("--mesh", default="dp=2,tp=2")
    parser.add_argument("--hardware", default="h100-sxm")
    args = parser.parse_args()

    model, inputs = gpt2.make(args.size, device="meta")
    start = time.perf_counter()
    capture(model, inputs)
    capture_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as cache:
        times, plans = [], []
        for _ in range(2):
            start = time.perf_counter()
            plans.append(autopar.plan(model, inputs, mesh=args.mesh, hardware=args.hardware, cache_dir=cache))
            times.append(time.perf_counter() - start)
    first, cached = plans
    assert cached.hash == first.hash and cached.history[-1].name == "cache"
    print(f"GPT-2-style '{args.size}' on ({args.mesh}) of {args.hardware}; capture alone {capture_s:.2f} s")
    print(f"first plan:  {times[0]:.2f} s (solver {first.solver.status}, {first.solver.seconds:.1f} s)")
    print(f"cached plan: {times[1]:.2f} s, same plan {cached.hash}")
    print(f"cached/first: {times[1] / times[0]:.3f}")


if __name__ == "__main__":
    main()
