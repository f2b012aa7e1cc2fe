"""The ``autopar`` command: plan and check models from the shell.

    autopar plan examples.gpt2:factory --mesh dp=2,tp=2 --hardware h100-sxm --out plan.json --emit torch:gen.py
    autopar check examples.gpt2:factory --mesh dp=2,tp=2 --steps 3
    autopar calibrate --out cpu.json
    autopar show plan.json
    autopar report plan.json --html report.html

FACTORY() returns (model, example_inputs); the model's forward returns the loss.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from autopar.errors import AutoparError
from autopar.ir.precision import PRESETS
from autopar.ir.request import DEFAULT_HARDWARE, DEFAULT_OPTIMIZER, DEFAULT_SOLVER, DEFAULT_TIME_LIMIT_S, SOLVERS
from autopar.lowering.memory import OPTIMIZERS


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


def cmd_plan(args) -> int:
    from autopar.api import plan
    from autopar.inspect.progress import terminal_progress

    model, inputs = load_factory(args.factory)
    mesh = int(args.mesh) if args.mesh.isdigit() else args.mesh  # a device count: search the meshes
    with terminal_progress(args.quiet) as progress:
        result = plan(model, inputs, mesh=mesh, hardware=args.hardware, solver=args.solver,
                      solver_time_limit_s=args.time_limit, cache=not args.no_cache, cache_dir=args.cache_dir,
                      precision=args.precision, schedule=args.schedule, microbatches=args.microbatches,
                      optimizer=args.optimizer, inv_every=args.inv_every, memory_budget=args.memory_budget,
                      offload=_OFFLOAD_CHOICES[args.offload], progress=progress)
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
    from autopar.inspect.diff import diff

    print(diff(_read_plan(args.a), _read_plan(args.b)))
    return 0


def _read_plan(path: str):
    from autopar.ir.plan import Plan

    try:
        with open(path) as f:
            return Plan.from_json(f.read())
    except OSError as exc:
        raise AutoparError(f"cannot read the plan file {path!r} ({exc.strerror}); write one with "
                           f"`autopar plan ... --out {path}`") from exc


def cmd_show(args) -> int:
    from rich.console import Console

    from autopar.inspect.show import render_plan

    plan = _read_plan(args.plan)
    # piped output is not wrapped to the 80 columns rich assumes without a terminal
    render_plan(plan, Console(width=None if sys.stdout.isatty() else 140))
    return 0


def cmd_report(args) -> int:
    from autopar.inspect.report_html import render_html

    plan = _read_plan(args.plan)
    try:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render_html(plan))
    except OSError as exc:
        raise AutoparError(f"cannot write the report to {args.html!r} ({exc.strerror})") from exc
    print(f"report of plan {plan.hash} written to {args.html}")
    return 0


def cmd_check(args) -> int:
    from autopar.check import check

    model, inputs = load_factory(args.factory)
    report = check(model, inputs, mesh=args.mesh, hardware=args.hardware, steps=args.steps, backend=args.backend,
                   precision=args.precision, compile=args.compile)
    print(report)
    return 0 if report.ok else 1


def cmd_calibrate(args) -> int:
    import time

    from autopar.cost_models.calibrate import calibrate
    from autopar.cost_models.hardware import calibrated_cpu_path, save_hardware

    out = args.out or calibrated_cpu_path()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    sizes = tuple(int(n) for n in args.world_sizes.split(","))
    start = time.perf_counter()
    hw = calibrate(sizes, name=args.name, progress=lambda msg: print(f"[calibrate] {msg}", flush=True))
    save_hardware(hw, out)
    use = "cpu" if out == calibrated_cpu_path() else out
    print(f"spec written to {out} in {time.perf_counter() - start:.0f} s; use it with --hardware {use}")
    return 0


_OFFLOAD_CHOICES = {"auto": "auto", "always": True, "never": False}


def _add_plan_command(sub, common) -> None:
    p = sub.add_parser("plan", parents=[common], help="plan a model and print the summary")
    p.add_argument("--out", help="write the plan as JSON here")
    p.add_argument("--emit", action="append", metavar="BACKEND:PATH", help="write the program: torch:gen.py "
                                                                          "(per rank, torchrun) or jax:gen.py")
    p.add_argument("--solver", default=DEFAULT_SOLVER, choices=SOLVERS,
                   help="lp-first: the LP relaxation, then SCIP or branch and bound on what it leaves open (the "
                        "default); mip: SCIP alone; cp-sat")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                   help="solver time limit per solve in seconds")
    p.add_argument("--schedule", help="on a mesh with pp: the pipeline schedule (torch's class name without "
                                      "'Schedule': GPipe, 1F1B, Interleaved1F1B, ...; default: searched)")
    p.add_argument("--microbatches", type=int, help="on a mesh with pp: the micro-batch count (default: searched)")
    p.add_argument("--optimizer", default=DEFAULT_OPTIMIZER, choices=sorted(OPTIMIZERS),
                   help=f"the optimizer whose state is counted (default {DEFAULT_OPTIMIZER}); kfac, on a mesh with pp: "
                        f"K-FAC with its curvature work placed in the pipeline's bubbles")
    p.add_argument("--inv-every", type=int, help="with --optimizer kfac: steps between curvature refreshes "
                                                 "(default: the shortest cycle within 1% of the best step time)")
    p.add_argument("--memory-budget", help="per device, e.g. 60GiB (default: 90%% of the device's memory)")
    p.add_argument("--offload", default="auto", choices=sorted(_OFFLOAD_CHOICES),
                   help="parameters and optimizer state in host memory: auto (where the budget needs it), "
                        "always, never")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--no-cache", action="store_true", help="solve again even if the plan cache holds this plan")
    p.add_argument("--cache-dir", help="plan cache directory (default $AUTOPAR_CACHE_DIR or ~/.cache/autopar/plans)")
    p.set_defaults(run=cmd_plan)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="autopar", description="Plan and check distributed training of "
                                                                 "PyTorch models.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("factory", help="MODULE:FACTORY; FACTORY() returns (model, example_inputs)")
    common.add_argument("--mesh", required=True, help="named mesh axes, e.g. dp=2,tp=2; for plan also a device "
                                                         "count (8) or auto: the fastest mesh of that many")
    common.add_argument("--hardware", default=DEFAULT_HARDWARE,
                        help=f"hardware preset (default {DEFAULT_HARDWARE}) or a spec file")
    common.add_argument("--precision", choices=sorted(PRESETS),
                        help="mixed precision: float32 parameters, compute in bf16 or fp16 (default: the model's "
                             "dtypes)")
    _add_plan_command(sub, common)
    c = sub.add_parser("check", parents=[common], help="run the plan on local CPU processes and compare "
                                                        "with eager PyTorch")
    c.add_argument("--steps", type=int, default=1, help="optimizer steps to compare (torch backend)")
    c.add_argument("--backend", default="torch", choices=["torch", "jax"],
                   help="run the torch program on gloo processes, or the JAX program on CPU devices")
    c.add_argument("--compile", action="store_true",
                   help="run the torch programs through torch.compile (Inductor), as autoparallelize(compile=True)")
    c.set_defaults(run=cmd_check)
    k = sub.add_parser("calibrate", help="measure this machine (local gloo processes) and write a hardware spec")
    k.add_argument("--out", help="where to write the spec (JSON); default: the file --hardware cpu reads")
    k.add_argument("--world-sizes", default="2,4", help="group sizes to time collectives in; the largest is "
                                                                "how many processes run (all at once)")
    k.add_argument("--name", default="local-cpu")
    k.set_defaults(run=cmd_calibrate)
    d = sub.add_parser("diff", help="where two plan files of one model differ, and the cost delta of each")
    d.add_argument("a", help="plan JSON (autopar plan --out)")
    d.add_argument("b", help="plan JSON to compare with the first")
    d.set_defaults(run=cmd_diff)
    v = sub.add_parser("show", help="print a plan file as tables: layers, placements, collectives, memory")
    v.add_argument("plan", help="plan JSON (autopar plan --out)")
    v.set_defaults(run=cmd_show)
    r = sub.add_parser("report", help="write a plan file as one self-contained HTML page")
    r.add_argument("plan", help="plan JSON (autopar plan --out)")
    r.add_argument("--html", required=True, metavar="OUT.html", help="where to write the page")
    r.set_defaults(run=cmd_report)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except AutoparError as exc:
        print(f"autopar: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
