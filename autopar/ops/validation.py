"""Strategy validation: every strategy a sharding rule offers, run for real on simulated ranks.

For one call of an op on real tensors, the rule's 1-D options are combined over a 2 x 2 mesh
as the planner combines them (``autopar.ir.strategy.combine``). For each strategy, every
simulated rank gets its block of each input (contiguous pieces, as the runtime hands them; a
partial input split into random summands), runs the op with its local arguments
(``Rule.local_call``, as the emitted program calls it; a kernel that communicates runs on one
thread per rank, autopar.ops.simulated_ranks), and the ranks' outputs are put back
together: shards concatenated, partial sums added, replicated outputs required equal on every
rank. The result must equal the op on the whole inputs. DTensor keeps its propagation rules
honest the same way; here it is what stands between a rule and a plan with wrong gradients.

``autopar.validate_rule(op, samples)`` runs it for any op, a user's custom op included.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Partial, Replicate, Shard, Spec
from autopar.ir.program import TensorMeta
from autopar.ir.strategy import combine
from autopar.ops.kinds import LocalShapes, OpCall, Rule, RuleDoesNotApply, communicating_axis
from autopar.ops.simulated_ranks import run_on_threads, runtime_kernel

MESH = Mesh(("x", "y"), (2, 2))

# outputs whose values the op leaves undefined (uninitialized memory): only shapes are compared
UNDEFINED_VALUES = frozenset({"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
                              "aten.empty_permuted.default", "aten.new_empty.default",
                              "aten.new_empty_strided.default"})


@dataclass(frozen=True)
class StrategyFailure:
    op: str
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    sample: str  # the call's tensor shapes and other arguments
    problem: str

    @property
    def strategy(self) -> str:
        return f"({', '.join(map(str, self.in_specs))}) -> ({', '.join(map(str, self.out_specs))})"

    def __str__(self) -> str:
        return f"{self.op} {self.strategy} on {self.sample}: {self.problem}"


@dataclass
class RuleReport:
    """What ``validate_rule`` found: ``ok`` when every strategy of every sample equals the op."""

    op: str
    samples: int = 0  # samples run
    strategies: int = 0  # strategies run, over all samples
    failures: list[StrategyFailure] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)  # samples the rule does not describe (then replicated)

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        head = (f"{self.op}: {self.strategies} strategies on {self.samples} samples, "
                f"{len(self.failures)} wrong" + (f", {len(self.declined)} samples declined" if self.declined else ""))
        return "\n".join([head] + [f"  {f.strategy} on {f.sample}: {f.problem}" for f in self.failures])


def validate_rule(op, samples: Iterable, *, rule: Rule | None = None, mesh: Mesh = MESH,
                  low_precision_partials: bool = False) -> RuleReport:
    """Run every strategy ``rule`` (default: the table's rule of ``op``) offers for each of
    ``samples`` on the simulated ranks of ``mesh`` and compare with ``op`` on whole tensors.

    ``samples``: calls of the op, each ``(args, kwargs)`` or an object with ``.args`` and
    ``.kwargs``, on real tensors. Use float64 tensors where the op takes them: the comparison's
    tolerance follows the inputs' precision, and a strategy that is right in exact arithmetic
    then passes with room to spare."""
    from autopar.ops.table import rule_for

    rule = rule if rule is not None else rule_for(op)
    if rule is None:
        raise AutoparError(f"{op} has no sharding rule to validate: add one with autopar.register_rule(op, rule)")
    report = RuleReport(str(op).replace("aten::", "aten."))
    for sample in samples:
        args, kwargs = _unpack(sample)
        report.samples += 1
        _validate_call(op, rule, args, kwargs, mesh, low_precision_partials, report)
    return report


def _unpack(sample) -> tuple[tuple, dict]:
    if hasattr(sample, "args"):
        return tuple(sample.args), dict(getattr(sample, "kwargs", None) or {})
    if isinstance(sample, (tuple, list)) and len(sample) == 2 and isinstance(sample[1], dict):
        return tuple(sample[0]), dict(sample[1])
    if isinstance(sample, (tuple, list)) and len(sample) == 1:
        return tuple(sample[0]), {}
    raise AutoparError(f"a sample is (args, kwargs) or an object with .args and .kwargs, got {type(sample).__name__}")


def _validate_call(op, rule: Rule, args: tuple, kwargs: dict, mesh: Mesh, low_precision_partials: bool,
                   report: RuleReport) -> None:
    tensors = _tensors((args, kwargs))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        expected = _leaves(op(*_cloned(args), **_cloned(kwargs)))
    call = _op_call(op, args, kwargs, tensors, expected, low_precision_partials)
    sample = describe(args, kwargs)
    try:
        options = rule.options(call)
    except RuleDoesNotApply as exc:
        report.declined.append(f"{sample}: {exc}")
        return
    in_metas = [TensorMeta.of(t) for t in tensors]
    out_metas = [TensorMeta.of(o) for o in expected]
    for o in options:
        if len(o.inputs) != len(tensors) or len(o.outputs) != len(expected):
            report.failures.append(StrategyFailure(report.op, (), (), sample,
                                                   f"the rule gave {o} for {len(tensors)} tensor inputs and "
                                                   f"{len(expected)} outputs"))
            return
    for in_specs, out_specs in combine(options, in_metas, out_metas, mesh):
        report.strategies += 1
        problem = _run_strategy(op, rule, call, tensors, expected, in_specs, out_specs, mesh)
        if problem is not None:
            report.failures.append(StrategyFailure(report.op, in_specs, out_specs, sample, problem))


def _op_call(op, args, kwargs, tensors, outputs, low_precision_partials: bool) -> OpCall:
    def dtype(t):
        return str(t.dtype).removeprefix("torch.") if isinstance(t, torch.Tensor) else None

    return OpCall(op, tuple(args), dict(kwargs), tuple(tuple(t.shape) for t in tensors),
                  tuple(tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in outputs),
                  tuple(t.is_floating_point() for t in tensors), tuple(dtype(t) for t in tensors),
                  tuple(dtype(o) for o in outputs), low_precision_partials)


def _run_strategy(op, rule: Rule, call: OpCall, tensors: list, expected: list, in_specs, out_specs,
                  mesh: Mesh) -> str | None:
    """None where the strategy computes the op, else what goes wrong."""
    coords_list = list(itertools.product(*(range(n) for n in mesh.shape)))
    local = LocalShapes(tuple(s.local_shape(t.shape, mesh) for s, t in zip(in_specs, tensors)),
                        tuple(None if not isinstance(o, torch.Tensor) else s.local_shape(o.shape, mesh)
                              for s, o in zip(out_specs, expected)), tuple(in_specs))
    local_op, local_args = rule.local_call(call, local)
    per_rank, rank_calls = {}, {}
    for coords in coords_list:
        blocks = iter([block(t, spec, mesh, coords, seed=i) for i, (t, spec) in enumerate(zip(tensors, in_specs))])
        rank_calls[coords] = (_with_tensors(local_args, blocks), _with_tensors(call.kwargs, blocks))
    try:
        axis = communicating_axis(rule, in_specs, mesh.shape)
        if axis is not None:  # the ranks communicate: run them side by side
            ran = run_on_threads(runtime_kernel(local_op), mesh.axis_names[axis], mesh,
                                 {c: a for c, (a, _) in rank_calls.items()},
                                 {c: k for c, (_, k) in rank_calls.items()})
            per_rank = {c: _leaves(out) for c, out in ran.items()}
        for coords, (rank_args, rank_kwargs) in rank_calls.items():
            if coords in per_rank:
                continue
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)  # a random op draws what the whole op drew (validate_rule seeds it alike)
                per_rank[coords] = _leaves(local_op(*rank_args, **rank_kwargs))
    except Exception as exc:  # any failure of the local op is the finding
        return f"the local op raises {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    for j, (want, spec) in enumerate(zip(expected, out_specs)):
        if not isinstance(want, torch.Tensor):
            continue
        tolerance = _tolerance(tensors, want)
        got, problem = assemble({c: outs[j] for c, outs in per_rank.items()}, spec, mesh, tolerance,
                                check_replicas=call_name(op) not in UNDEFINED_VALUES)
        if problem is None:
            problem = _compare(got, want, tolerance, values=call_name(op) not in UNDEFINED_VALUES)
        if problem is not None:
            return f"output {j}: {problem}"
    return None


def call_name(op) -> str:
    return str(op).replace("aten::", "aten.")


def block(x: torch.Tensor, spec: Spec, mesh: Mesh, coords: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """The block of ``x`` that the rank at ``coords`` holds under ``spec``: its piece of each
    sharded dim, and on a partial axis one of that axis's summands of ``x``, random numbers
    that add up to it (drawn from ``seed``, the axis and the coordinates before it on split
    axes, so the ranks along the other axes hold pieces of the same summand)."""
    y = x
    for axis, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            size = y.shape[p.dim] // mesh.shape[axis]
            y = y.narrow(p.dim, coords[axis] * size, size)
        elif isinstance(p, Partial):
            # ranks that differ only along replicated axes hold the same values
            where = tuple(c if not isinstance(q, Replicate) else -1 for c, q in zip(coords[:axis], spec.placements))
            y = _summands(y, mesh.shape[axis], seed=hash((seed, axis, where)) % (1 << 31))[coords[axis]]
    return y.clone()


def _summands(y: torch.Tensor, n: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    finite = y[torch.isfinite(y)] if y.is_floating_point() else y
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    noise = [(torch.randn(y.shape, generator=generator, dtype=torch.float64) * (scale or 1.0)).to(y.dtype)
             for _ in range(n - 1)]
    return noise + [y - sum(noise, torch.zeros_like(y))]


def assemble(pieces: dict, spec: Spec, mesh: Mesh, tolerance: float, check_replicas: bool = True):
    """(the global tensor, None) from each rank's output under ``spec``, or (None, what is wrong):
    the last axis is joined first, within each coordinate of the axes before it."""
    for axis in reversed(range(mesh.ndim)):
        placement = spec.placements[axis]
        joined = {}
        for prefix in {c[:axis] for c in pieces}:
            parts = [pieces[prefix + (i,)] for i in range(mesh.shape[axis])]
            if isinstance(placement, (Shard, Partial)):
                try:
                    joined[prefix] = torch.cat(parts, placement.dim) if isinstance(placement, Shard) \
                        else sum(parts[1:], parts[0])
                except (RuntimeError, IndexError) as exc:  # ranks' blocks that do not fit together
                    return None, f"the ranks' blocks do not join on mesh axis {axis} as {placement}: {exc}"
            else:
                assert isinstance(placement, Replicate)
                if check_replicas and any(_compare(p, parts[0], tolerance) for p in parts[1:]):
                    return None, f"replicated on mesh axis {axis} but differs between its ranks"
                joined[prefix] = parts[0]
        pieces = joined
    return pieces[()], None


def _compare(got: torch.Tensor, want: torch.Tensor, tolerance: float, values: bool = True) -> str | None:
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if not values or want.numel() == 0:
        return None
    if want.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    if not want.is_floating_point():
        return None if torch.equal(got, want) else f"{int((got != want).sum())} of {want.numel()} values differ"
    got64, want64 = got.double(), want.double()
    finite = want64[torch.isfinite(want64)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    close = torch.isclose(got64, want64, rtol=tolerance, atol=tolerance * scale, equal_nan=True)
    if bool(close.all()):
        return None
    worst = float((got64 - want64).abs().nan_to_num(float("inf"))[~close].max())
    return f"{int((~close).sum())} of {want.numel()} values differ, by up to {worst:.3g} (scale {scale:.3g})"


def _tolerance(tensors: list, output: torch.Tensor) -> float:
    """Relative tolerance for ``output`` computed from ``tensors``: a valid strategy differs from
    the whole op only by the order of its sums, in the lowest precision among the floating-point
    inputs (the output's own, where none is)."""
    dtypes = [t.dtype for t in tensors if t.is_floating_point() or t.is_complex()] or [output.dtype]
    if not any(d.is_floating_point or d.is_complex for d in dtypes):
        return 0.0
    eps = max(torch.finfo(d if d.is_floating_point else d.to_real()).eps for d in dtypes
              if d.is_floating_point or d.is_complex)
    return 1e-7 if eps < 1e-10 else 1e-4 if eps < 1e-5 else 2e-2


def describe(args, kwargs) -> str:
    """A short text of a call: tensors as dtype[shape], other arguments as they are."""
    def text(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        if isinstance(v, (list, tuple)):
            items = ", ".join(text(x) for x in v)
            return f"[{items}]" if isinstance(v, list) else f"({items})"
        return repr(v)

    parts = [text(a) for a in args] + [f"{k}={text(v)}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in ``value`` in flattened (args, kwargs) order, as the planner numbers a node's inputs."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _with_tensors(value, supply) -> Any:
    if isinstance(value, torch.Tensor):
        return next(supply)
    if isinstance(value, (list, tuple)):
        return type(value)(_with_tensors(v, supply) for v in value)
    if isinstance(value, dict):
        return {k: _with_tensors(v, supply) for k, v in value.items()}
    return value


def _cloned(value):
    return _with_tensors(value, iter([t.clone() for t in _tensors(value)]))


def _leaves(output) -> list:
    """An op's outputs as a flat list, as the planner's metas number them."""
    if isinstance(output, (tuple, list)):
        return list(output)
    return [output]
