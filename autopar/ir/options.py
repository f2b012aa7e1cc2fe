"""Every option of autopar.plan, autopar.check, autopar.autoparallelize and the ``autopar``
command, declared once: its name, type, default and one-line doc, which functions and
commands take it, and its command-line flag. The functions take their keyword parameters
from here (``take`` validates them and fills the defaults; ``signature`` gives them their
signature), the CLI its flags and help, and docs/options.md its table (``markdown_table``).
"""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autopar.ir.precision import PRESETS
from autopar.ir.request import (
    DEFAULT_HARDWARE,
    DEFAULT_OFFLOAD,
    DEFAULT_OPTIMIZER,
    DEFAULT_RECOMPUTE,
    DEFAULT_SOLVER,
    DEFAULT_TIME_LIMIT_S,
    DEFAULT_WORK_LIMIT,
    PARTITIONS,
    SOLVERS,
)

PLAN, CHECK, PARALLELIZE = "plan", "check", "autoparallelize"


class _Required:
    def __repr__(self) -> str:
        return "required"


REQUIRED = _Required()  # an option the function cannot do without


@dataclass(frozen=True)
class Option:
    name: str
    annotation: str  # the type, as the docs print it
    default: Any
    doc: str  # one line
    functions: tuple[str, ...]  # the API functions that take it
    planning: bool = False  # a PlanRequest field: autopar.planning.request.resolve reads it
    cli: tuple[str, ...] = ()  # the ``autopar`` commands that take it
    flag: str | None = None  # its flag, where not --<name with dashes>
    cli_type: Callable | None = None  # argparse's type
    choices: tuple | None = None  # the values the CLI accepts
    required_in: tuple[str, ...] = ()  # functions that need it given

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def default_in(self, function: str):
        return REQUIRED if function in self.required_in else self.default


_ALL = (PLAN, CHECK, PARALLELIZE)
OPTIONS: tuple[Option, ...] = (
    # where and on what
    Option("mesh", "dict | str | int | Mesh", None, "named mesh axes ({'dp': 2, 'tp': 2} or 'dp=2,tp=2'); for plan "
           "and autoparallelize also a device count (64), 'auto' (the process group's size) or a list of meshes: "
           "the fastest of them",
           _ALL, cli=(PLAN, CHECK), required_in=(PLAN, PARALLELIZE)),
    Option("hardware", "str | Hardware", DEFAULT_HARDWARE, "a hardware preset's name, a spec file, or a Hardware",
           _ALL, cli=(PLAN, CHECK)),
    Option("precision", "str | MixedPrecision | None", None, "None (the model's dtypes), 'bf16-mixed', 'fp16-mixed' "
           "or a MixedPrecision: float32 parameters, compute in the low precision", _ALL, planning=True,
           cli=(PLAN, CHECK), choices=tuple(PRESETS)),
    # the call
    Option("kwargs", "dict | None", None, "the model's keyword arguments, beside example_inputs", (PLAN, CHECK)),
    Option("loss_fn", "Callable | None", None, "picks the loss out of the model's output (lambda out: out.loss)",
           _ALL),
    # the solve
    Option("solver", "str", DEFAULT_SOLVER, "'lp-first' (the LP relaxation, then SCIP or branch and bound on what "
           "it leaves open), 'mip' (SCIP alone) or 'cp-sat'", (PLAN,), planning=True, cli=(PLAN,), choices=SOLVERS),
    Option("solver_work_limit", "int", DEFAULT_WORK_LIMIT, "deterministic work per solve (about one simplex "
           "iteration a unit); past it the best plan found, with its proven gap: the same plan on any machine under "
           "any load", (PLAN,), planning=True, cli=(PLAN,), flag="--work-limit", cli_type=int),
    Option("solver_time_limit_s", "float", DEFAULT_TIME_LIMIT_S, "seconds per solve, a safety net: a plan it stops "
           "depends on the machine's speed and load, and warns so", (PLAN,), planning=True, cli=(PLAN,),
           flag="--time-limit", cli_type=float),
    Option("pin", "dict | None", None, "parameter (or module, or glob) -> placements text, e.g. {'fc1.weight': "
           "'S(0),R'}", (PLAN,), planning=True),
    Option("memory_budget", "str | float | None", None, "bytes per device, or text such as '60GiB' (default: 90% of "
           "the device's memory)", (PLAN,), planning=True, cli=(PLAN,)),
    Option("optimizer", "str", DEFAULT_OPTIMIZER, "the optimizer whose state is counted: 'sgd', 'adam', "
           "'adam-mixed', or 'kfac' (on a mesh with pp: its work in the pipeline's bubbles)", (PLAN,), planning=True,
           cli=(PLAN,)),
    Option("recompute", "str", DEFAULT_RECOMPUTE, "'auto' (recompute where the budget needs it), 'full' or 'none'",
           (PLAN,), planning=True),
    Option("offload", "str | bool", DEFAULT_OFFLOAD, "parameters and optimizer state in host memory: 'auto' (where "
           "the budget needs it), True (always) or False (never)", (PLAN,), planning=True, cli=(PLAN,)),
    Option("symbolic_dims", "dict | None", None, "input sizes to keep symbolic, e.g. {'batch': 0}: the plan "
           "carries its cost as a formula of them", (PLAN,), planning=True),
    Option("moe_imbalance", "float", 1.0, "mixture-of-experts routing's load imbalance, the busiest expert's tokens "
           "over the mean (1.0: balanced); prices expert parallelism's busiest rank", (PLAN,), planning=True,
           cli=(PLAN,), cli_type=float),
    Option("cluster_layers", "bool", True, "identical repeated layers share the solver's variables", (PLAN,),
           planning=True),
    # pipelines
    Option("schedule", "str | None", None, "on a mesh with pp: torch's schedule class without 'Schedule' (GPipe, "
           "1F1B, ...; default: searched)", _ALL, planning=True, cli=(PLAN,)),
    Option("microbatches", "int | None", None, "on a mesh with pp: the micro-batch count (default: searched)", _ALL,
           planning=True, cli=(PLAN,), cli_type=int),
    Option("partition", "str", "balanced", "on a mesh with pp: 'balanced' stages or 'even' runs of layers", (PLAN,),
           planning=True, choices=PARTITIONS),
    Option("inv_every", "int | None", None, "with optimizer='kfac': steps between curvature refreshes (default: "
           "chosen)", (PLAN,), planning=True, cli=(PLAN,), cli_type=int),
    # how the plan is made
    Option("restrict", "Callable | None", None, "restrict(node, strategy) -> False rules a strategy out", (PLAN,)),
    Option("passes", "Sequence[Pass]", (), "extra passes for the plans (see autopar.register_pass)",
           (PLAN, PARALLELIZE)),
    Option("cache", "bool", True, "load a plan of the same step and options from the plan cache", (PLAN,),
           cli=(PLAN,), flag="--no-cache"),
    Option("cache_dir", "str | None", None, "the plan cache's directory (default $AUTOPAR_CACHE_DIR or "
           "~/.cache/autopar/plans)", (PLAN,), cli=(PLAN,)),
    Option("progress", "Callable | None", None, "called with a line of text at each stage of planning", (PLAN,)),
    Option("verbose", "bool", False, "print the stages of planning to stderr (logger ``autopar``, INFO)", (PLAN,)),
    # running a plan
    Option("plan", "Plan | None", None, "a plan made already (autopar.plan, Plan.from_json), instead of planning",
           (CHECK, PARALLELIZE)),
    Option("compile", "bool", False, "run the torch programs through torch.compile (Inductor)",
           (CHECK, PARALLELIZE), cli=(CHECK,)),
    Option("steps", "int", 1, "optimizer steps to compare with eager's", (CHECK,), cli=(CHECK,), cli_type=int),
    Option("lr", "float", 0.1, "the SGD learning rate of the compared steps", (CHECK,)),
    Option("measure_memory", "bool", False, "measure each rank's peak tensor memory of a step", (CHECK,)),
    Option("backend", "str", "torch", "'torch' (gloo processes) or 'jax' (CPU devices in a fresh interpreter)",
           (CHECK,), cli=(CHECK,), choices=("torch", "jax")),
    Option("device", "str | None", None, "the device the programs run on (default: cuda under NCCL, else cpu)",
           (PARALLELIZE,)),
    Option("replan", "bool", True, "plan a call of other shapes on its first use (False: refuse it)",
           (PARALLELIZE,)),
    Option("inputs", "str", "global", "'global' (every rank passes the whole batch) or 'local' (its block of dim 0 "
           "over the dp axes)", (PARALLELIZE,)),
    Option("init", "str | Callable | None", "reset_parameters", "how a model on the meta device is initialized: "
           "'reset_parameters', a function of a module, or None", (PARALLELIZE,)),
    Option("example_inputs", "tuple | None", None, "plan and shard now, as a first call with these would",
           (PARALLELIZE,)),
    Option("example_kwargs", "dict | None", None, "keyword arguments of that first call", (PARALLELIZE,)),
)
_BY_NAME = {o.name: o for o in OPTIONS}


class Options:
    """One function's options, resolved: every option it takes, given or defaulted, read as
    attributes (``options.mesh``); immutable."""

    def __init__(self, function: str, values: dict):
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{self._function} has no option {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError("options are resolved once and not changed")

    def planning(self) -> dict:
        """The options that become a PlanRequest's fields (autopar.planning.request.resolve's keywords)."""
        return {name: value for name, value in self._values.items() if _BY_NAME[name].planning}

    def replace(self, **changes) -> Options:
        return take(self._function, {**self._values, **changes})

    def __repr__(self) -> str:
        return f"Options({self._function}: " + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"


def declared(function: str) -> list[Option]:
    """The options ``function`` ("plan", "check", "autoparallelize") takes, in declaration order."""
    return [o for o in OPTIONS if function in o.functions]


def take(function: str, given: dict) -> Options:
    """``given`` keyword options of ``function``, checked against the declarations (an unknown
    name is a TypeError naming the closest one) and completed with the defaults."""
    known = {o.name: o for o in declared(function)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(known)}"
        raise TypeError(f"{function}() got an unexpected option {unknown[0]!r}{hint}")
    values = {}
    for name, option in known.items():
        value = given.get(name, option.default_in(function))
        if value is REQUIRED:
            raise TypeError(f"{function}() needs the option {name!r}: {option.doc}")
        values[name] = value
    return Options(function, values)


def signature(function: str, leading: list[inspect.Parameter]) -> inspect.Signature:
    """``function``'s signature: its ``leading`` parameters, then its options as keywords."""
    keywords = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY,
                                  default=inspect.Parameter.empty if o.default_in(function) is REQUIRED
                                  else o.default, annotation=o.annotation)
                for o in declared(function)]
    return inspect.Signature(leading + keywords)


def markdown_table() -> str:
    """The docs' table of every option: where it is taken, its default and what it does."""
    rows = ["| option | type | default | taken by | flag | what it does |", "|---|---|---|---|---|---|"]
    for o in OPTIONS:
        defaults = {repr(o.default_in(f)) for f in o.functions}
        default = " / ".join(sorted(defaults))
        takers = ", ".join(f"`{f}`" for f in o.functions) + "".join(f", `autopar {c}`" for c in o.cli)
        flag = f"`{o.cli_flag}`" if o.cli else ""
        kind = o.annotation.replace(" | ", " or ")  # a pipe would end the cell
        rows.append(f"| `{o.name}` | `{kind}` | `{default}` | {takers} | {flag} | {o.doc} |")
    return "\n".join(rows)


OPTIONS_PAGE_HEAD = """# Options

Every option of `autopar.plan`, `autopar.check`, `autopar.autoparallelize` and the `autopar`
command, generated from their declarations in `autopar/ir/options.py` (each declared once: the
functions take their keywords, checks and defaults from there, and the command its flags and
help). `required` marks an option a function cannot do without. A test keeps this page equal to
the declarations; after changing them, `AUTOPAR_REGENERATE_DOCS=1 .venv/bin/python -m pytest -q
tests/test_docs.py` rewrites it.

"""


def options_page() -> str:
    """docs/options.md."""
    return OPTIONS_PAGE_HEAD + markdown_table() + "\n"
