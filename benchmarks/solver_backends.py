"""The two OR-Tools backends on real graphs: SCIP (MIP, the default) vs CP-SAT.

Same problems, same time limit, same warm start; prints each backend's objective, proven
bound, gap and time, so the default can be chosen on evidence.

    python benchmarks/solver_backends.py [--time-limit 30]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autopar.capture.export import capture  # noqa: E402
from autopar.planning.pipeline import plan_captured  # noqa: E402
from examples import gpt2, hf_zoo  # noqa: E402


def cases():
    yield "gpt2-style 4 layers", gpt2.make(dataclasses.replace(gpt2.SIZES["small"], layers=4), device="meta")
    yield "llama (zoo) 4 layers", _meta(lambda: hf_zoo.make("llama", **hf_zoo.sizes("llama"), layers=4))
    yield "bert (zoo) 2 layers", _meta(lambda: hf_zoo.make("bert", **hf_zoo.sizes("bert")))


def _meta(make):
    import torch

    with torch.device("meta"):
        return make()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--meshes", default="dp=8;dp=2,tp=4")
    args = parser.parse_args()
    print(f"{'model':<22} {'mesh':<14} {'backend':<7} {'status':<9} {'objective':>11} {'bound':>11} {'gap':>7} "
          f"{'time':>7}")
    for label, (model, inputs) in cases():
        program = capture(model, inputs)
        for mesh in args.meshes.split(";"):
            for backend in ("mip", "cp-sat"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    s = plan_captured(program, model, inputs, mesh=mesh, hardware="h100-sxm", solver=backend,
                                      solver_time_limit_s=args.time_limit).solver
                print(f"{label:<22} {mesh:<14} {backend:<7} {s.status:<9} {s.objective_s * 1e3:>9.4f}ms "
                      f"{s.bound_s * 1e3:>9.4f}ms {s.gap:>7.2%} {s.seconds:>6.1f}s", flush=True)


if __name__ == "__main__":
    main()
