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
from autopar.ir.options import CHECK, OPTIONS, PLAN, REQUIRED


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
    with terminal_progress(args.quiet) as progress:
        result = plan(model, inputs, **_options(args, PLAN), progress=progress)
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
    report = check(model, inputs, **_options(args, CHECK))
    print(report)
    return 0 if report.ok else 1


def cmd_profile(args) -> int:
    from autopar.api import plan
    from autopar.inspect.progress import terminal_progress
    from autopar.profile import profile

    model, inputs = load_factory(args.factory)
    with terminal_progress(True) as progress:
        planned = plan(model, inputs, **_options(args, PLAN), progress=progress)
    print(profile(planned, model, inputs, out_dir=args.out, steps=args.steps,
                  hardware=args.hardware))
    return 0


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


def _add_options(parser, command: str) -> None:
    """The flags of ``command`` ("plan" or "check"): the options autopar.ir.options declares for it."""
    for o in OPTIONS:
        if command not in o.cli:
            continue
        help_text = o.doc.replace("%", "%%")
        if isinstance(o.default, bool):  # a switch: --compile turns it on, --no-cache off
            parser.add_argument(o.cli_flag, dest=o.name, action="store_false" if o.default else "store_true",
                                help=help_text)
        elif o.name == "offload":
            parser.add_argument(o.cli_flag, dest=o.name, default="auto", choices=sorted(_OFFLOAD_CHOICES),
                                help=help_text + " (auto, always, never)")
        else:
            parser.add_argument(o.cli_flag, dest=o.name, type=o.cli_type, choices=o.choices,
                                default=None if o.default_in(command) is REQUIRED else o.default,
                                required=o.default_in(command) is REQUIRED, help=help_text)


def _options(args, command: str) -> dict:
    """The parsed flags of ``command`` as the API's options."""
    options = {o.name: getattr(args, o.name) for o in OPTIONS if command in o.cli}
    if isinstance(options.get("mesh"), str) and options["mesh"].isdigit():
        options["mesh"] = int(options["mesh"])  # a device count: search the meshes
    if "offload" in options:
        options["offload"] = _OFFLOAD_CHOICES[options["offload"]]
    return options


def _add_plan_command(sub, common) -> None:
    p = sub.add_parser("plan", parents=[common], help="plan a model and print the summary")
    _add_options(p, PLAN)
    p.add_argument("--out", help="write the plan as JSON here")
    p.add_argument("--emit", action="append", metavar="BACKEND:PATH", help="write the program: torch:gen.py "
                                                                          "(per rank, torchrun) or jax:gen.py")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(run=cmd_plan)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="autopar", description="Plan and check distributed training of "
                                                                 "PyTorch models.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("factory", help="MODULE:FACTORY; FACTORY() returns (model, example_inputs)")
    _add_plan_command(sub, common)
    c = sub.add_parser("check", parents=[common], help="run the plan on local CPU processes and compare "
                                                        "with eager PyTorch")
    _add_options(c, CHECK)
    c.set_defaults(run=cmd_check)
    f = sub.add_parser("profile", parents=[common], help="plan, then run the plan on local CPU processes under "
                                                          "torch.profiler: predicted and measured traces, and "
                                                          "their times per op class")
    _add_options(f, PLAN)
    f.add_argument("--out", default="autopar-profile", help="the folder for predicted.json and "
                                                            "measured-rank<r>.json")
    f.add_argument("--steps", type=int, default=3, help="steps to profile (after one to warm up)")
    f.set_defaults(run=cmd_profile)
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
