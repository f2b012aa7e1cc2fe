"""The ``autopar`` command: plan and check models from the shell.

    autopar plan examples.gpt2:factory --mesh dp=2,tp=2 --hardware h100-sxm --out plan.json --emit torch:gen.py
    autopar check examples.gpt2:factory --mesh dp=2,tp=2 --steps 3
    autopar calibrate --out cpu.json

FACTORY() returns (model, example_inputs); the model's forward returns the loss.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from autopar.errors import AutoparError


def load_factory(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AutoparError(f"expected MODULE:FACTORY (e.g. examples.gpt2:factory), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AutoparError(f"cannot import {module_name!r} ({exc}); run from the directory that holds it") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise AutoparError(f"{module_name!r} has no callable {attr!r}")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise AutoparError(f"{spec}() must return (model, example_inputs), got {type(made).__name__}")
    return made


def _progress(quiet: bool):
    if quiet or not sys.stderr.isatty():
        return None
    return lambda msg: print(f"[autopar] {msg}", file=sys.stderr, flush=True)


def cmd_plan(args) -> int:
    from autopar.api import plan

    model, inputs = load_factory(args.factory)
    mesh = int(args.mesh) if args.mesh.isdigit() else args.mesh  # a device count: search the meshes
    result = plan(model, inputs, mesh=mesh, hardware=args.hardware, solver=args.solver,
                  solver_time_limit_s=args.time_limit, progress=_progress(args.quiet))
    print(result.summary())
    if args.out:
        with open(args.out, "w") as f:
            f.write(result.to_json())
        print(f"\nplan written to {args.out}")
    for target in args.emit or []:
        backend, sep, path = target.partition(":")
        if not sep:
            raise AutoparError(f"--emit takes BACKEND:PATH (e.g. torch:gen.py), got {target!r}")
        with open(path, "w") as f:
            f.write(result.emit(backend))
        print(f"{backend} program written to {path}")
    return 0


def cmd_diff(args) -> int:
    from autopar.diff import diff
    from autopar.plan import Plan

    plans = []
    for path in (args.a, args.b):
        with open(path) as f:
            plans.append(Plan.from_json(f.read()))
    result = diff(*plans)
    print(result)
    return 0


def cmd_check(args) -> int:
    from autopar.check import check

    model, inputs = load_factory(args.factory)
    report = check(model, inputs, mesh=args.mesh, hardware=args.hardware, steps=args.steps, backend=args.backend)
    print(report)
    return 0 if report.ok else 1


def cmd_calibrate(args) -> int:
    import time

    from autopar.calibrate import calibrate
    from autopar.cost_models.hardware import save_hardware

    from autopar.cost_models.hardware import calibrated_cpu_path

    out = args.out or calibrated_cpu_path()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    sizes = tuple(int(n) for n in args.world_sizes.split(","))
    start = time.perf_counter()
    hw = calibrate(sizes, name=args.name, progress=lambda msg: print(f"[calibrate] {msg}", flush=True))
    save_hardware(hw, out)
    use = "cpu" if out == calibrated_cpu_path() else out
    print(f"spec written to {out} in {time.perf_counter() - start:.0f} s; use it with --hardware {use}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="autopar", description="Plan and check distributed training of "
                                                                 "PyTorch models.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("factory", help="MODULE:FACTORY; FACTORY() returns (model, example_inputs)")
    common.add_argument("--mesh", required=True, help="named mesh axes, e.g. dp=2,tp=2; for plan also a device "
                                                         "count (8) or auto: the fastest mesh of that many")
    common.add_argument("--hardware", default="h100-sxm", help="hardware preset (default h100-sxm) or a spec file")
    p = sub.add_parser("plan", parents=[common], help="plan a model and print the summary")
    p.add_argument("--out", help="write the plan as JSON here")
    p.add_argument("--emit", action="append", metavar="BACKEND:PATH", help="write the program: torch:gen.py "
                                                                          "(per rank, torchrun) or jax:gen.py")
    p.add_argument("--solver", default="mip", choices=["mip", "cp-sat"])
    p.add_argument("--time-limit", type=float, default=60.0, help="solver time limit in seconds")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(run=cmd_plan)
    c = sub.add_parser("check", parents=[common], help="run the plan on local CPU processes and compare "
                                                        "with eager PyTorch")
    c.add_argument("--steps", type=int, default=1, help="optimizer steps to compare (torch backend)")
    c.add_argument("--backend", default="torch", choices=["torch", "jax"],
                   help="run the torch program on gloo processes, or the JAX program on CPU devices")
    c.set_defaults(run=cmd_check)
    k = sub.add_parser("calibrate", help="measure this machine (local gloo processes) and write a hardware spec")
    k.add_argument("--out", help="where to write the spec (JSON); default: the file --hardware cpu reads")
    k.add_argument("--world-sizes", default="2,4", help="process counts to measure collectives over")
    k.add_argument("--name", default="local-cpu")
    k.set_defaults(run=cmd_calibrate)
    d = sub.add_parser("diff", help="where two plan files of one model differ, and the cost delta of each")
    d.add_argument("a", help="plan JSON (autopar plan --out)")
    d.add_argument("b", help="plan JSON to compare with the first")
    d.set_defaults(run=cmd_diff)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except AutoparError as exc:
        print(f"autopar: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
