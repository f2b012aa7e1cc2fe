"""How long `autopar show` and `autopar report --html` take on the largest model of the
Hugging Face zoo (Mixtral, 121M parameters at the zoo's benchmark sizes), planned on the
meta device for 8 H100s: reading the plan file, printing the tables, rendering the page.

    python benchmarks/inspect_report.py [--model mixtral] [--mesh dp=2,tp=4] [--time-limit 15]

The solver's time limit is short (planning takes about 40 s on 2 cores): the layouts'
quality does not change how long the plan takes to show.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402

import autopar  # noqa: E402
from autopar.inspect.report_html import render_html  # noqa: E402
from autopar.inspect.show import render_plan  # noqa: E402
from examples import hf_zoo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mixtral", choices=list(hf_zoo.ZOO))
    parser.add_argument("--mesh", default="dp=2,tp=4")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--time-limit", type=float, default=15.0)
    args = parser.parse_args()

    with torch.device("meta"):
        model, inputs = hf_zoo.make(args.model, **hf_zoo.sizes(args.model))
    start = time.perf_counter()
    plan = autopar.plan(model, inputs, mesh=args.mesh, hardware=args.hardware, solver_time_limit_s=args.time_limit,
                        cache=False)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{args.model}: {params:.0f}M parameters, {len(plan.graph.nodes)} graph nodes, "
          f"{len(plan.collectives())} collectives; planned on ({args.mesh}) in {time.perf_counter() - start:.1f} s")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        with open(path, "w") as f:
            f.write(plan.to_json())
        start = time.perf_counter()
        with open(path) as f:
            loaded = autopar.Plan.from_json(f.read())
        load_s = time.perf_counter() - start
        print(f"plan file: {os.path.getsize(path) / 1e6:.1f} MB, loaded in {load_s:.2f} s")

    start = time.perf_counter()
    render_plan(loaded, Console(file=io.StringIO(), width=140))
    print(f"show (rich tables): {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    page = render_html(loaded)
    report_s = time.perf_counter() - start
    print(f"report page: {len(page.encode()) / 1e6:.1f} MB")
    print(f"report time: {report_s:.2f} s")


if __name__ == "__main__":
    main()
