"""Tensor sizes as formulas of named input sizes (batch, sequence length, ...).

The plan is solved on one concrete graph. To state its cost as a formula we
capture the same step again with each named size changed (every corner of
{planning value, other value}^k) and interpolate each tensor dim
multilinearly. Dims in training graphs are sums of products of distinct sizes
(``batch``, ``seq``, ``batch*seq``, ``seq - 1``, constants), which multilinear
interpolation reproduces exactly; a dim such as ``seq**2`` would not be, which
is why a dim of that form is not supported (none of the zoo has one).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy
import torch
from torch import nn

from autopar.capture.export import capture
from autopar.errors import AutoparError
from autopar.ir.program import Program, TensorMeta, output_metas


@dataclass(frozen=True)
class SizeSymbols:
    """Named input dims: ``dims[name]`` is the dim index in every tensor input that has it."""

    dims: dict[str, int]
    values: dict[str, int]  # the planning sizes

    def symbol(self, name: str) -> sympy.Symbol:
        return sympy.Symbol(name, positive=True, integer=True)

    @property
    def symbols(self) -> dict[str, sympy.Symbol]:
        return {name: self.symbol(name) for name in self.dims}


def size_symbols(example_inputs: tuple, dims: dict[str, int]) -> SizeSymbols:
    """Read each named size off the example inputs; they must agree where several inputs have the dim."""
    if not dims:
        raise AutoparError("symbolic_dims is empty; name at least one input dim, e.g. {'batch': 0, 'seq': 1}")
    values = {}
    for name, dim in dims.items():
        if not name.isidentifier():
            raise AutoparError(f"symbolic size name {name!r} must be a Python identifier, e.g. 'batch'")
        sizes = {x.shape[dim] for x in example_inputs if isinstance(x, torch.Tensor) and x.dim() > dim}
        if not sizes:
            raise AutoparError(f"no example input has dim {dim} for symbolic size {name!r}")
        if len(sizes) > 1:
            raise AutoparError(f"the example inputs disagree on {name!r} (dim {dim} is {sorted(sizes)}); "
                               f"name only dims that mean the same size in every input")
        values[name] = sizes.pop()
    return SizeSymbols(dict(dims), values)


def other_value(v: int) -> int:
    """A second size to capture at: half when that stays above 1 (size-1 dims trace differently, and
    doubling may pass a model's maximum length), else double."""
    return v // 2 if v % 2 == 0 and v // 2 >= 2 else 2 * v


def resized(example_inputs: tuple, sizes: SizeSymbols, values: dict[str, int]) -> tuple:
    out = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            shape = list(x.shape)
            for name, dim in sizes.dims.items():
                if x.dim() > dim:
                    shape[dim] = values[name]
            x = x.new_zeros(shape)  # values do not matter to a traced graph; zeros are valid token ids
        out.append(x)
    return tuple(out)


def fit_shapes(model: nn.Module, example_inputs: tuple, program: Program, sizes: SizeSymbols,
               progress=None, loss_fn=None) -> dict[str, tuple[TensorMeta | None, ...]]:
    """node name -> its output metas with each dim a sympy expression of the named sizes."""
    names = list(sizes.dims)
    points = [(sizes.values[n], other_value(sizes.values[n])) for n in names]
    base = {n.name: output_metas(n) for n in program.nodes() if n.op != "output"}
    corners = {}
    for corner in itertools.product((0, 1), repeat=len(names)):
        if not any(corner):
            corners[corner] = base
            continue
        values = {n: points[i][c] for i, (n, c) in enumerate(zip(names, corner))}
        if progress:
            progress(f"capturing at {values} for the cost formula ...")
        other = capture(model, resized(example_inputs, sizes, values), loss_fn=loss_fn)
        corners[corner] = _metas_matching(program, other, values)
    symbols = [sizes.symbol(n) for n in names]
    interpolate = _Interpolator(symbols, points)
    out = {}
    for node, metas in base.items():
        out[node] = tuple(
            None if m is None else TensorMeta(
                tuple(interpolate(tuple(corners[c][node][i].shape[d] for c in corners)) for d in range(len(m.shape))),
                m.dtype)
            for i, m in enumerate(metas))
    return out


def _metas_matching(program: Program, other: Program, values: dict) -> dict:
    """The other capture's metas by node name, after checking that it is the same graph."""
    mine = [(n.name, n.target) for n in program.nodes()]
    theirs = [(n.name, n.target) for n in other.nodes()]
    if mine != theirs:
        first = next(((a, b) for a, b in zip(mine, theirs) if a != b), None)
        where = f" (first difference: {first[0]} vs {first[1]})" if first else f" ({len(mine)} vs {len(theirs)} nodes)"
        raise AutoparError(f"the traced step has a different graph at sizes {values}{where}: its structure depends on "
                           f"these sizes, so no single cost formula covers them; plan without symbolic_dims")
    metas = {n.name: output_metas(n) for n in other.nodes() if n.op != "output"}
    for name, m in metas.items():
        ranks = [x is None or len(x.shape) for x in output_metas(program.node(name))]
        if [x is None or len(x.shape) for x in m] != ranks:
            raise AutoparError(f"node {name} changes rank at sizes {values}; plan without symbolic_dims")
    return metas


class _Interpolator:
    """The multilinear polynomial through the values at the corners (Lagrange basis per size)."""

    def __init__(self, symbols, points):
        self.symbols, self.points = symbols, points
        self._memo: dict = {}

    def __call__(self, corner_values: tuple[int, ...]):
        if all(v == corner_values[0] for v in corner_values):
            return corner_values[0]  # does not depend on any named size
        hit = self._memo.get(corner_values)
        if hit is None:
            expr = sympy.Integer(0)
            for corner, value in zip(itertools.product((0, 1), repeat=len(self.symbols)), corner_values):
                term = sympy.Rational(value)
                for x, (v0, v1), c in zip(self.symbols, self.points, corner):
                    here, there = (v0, v1) if c == 0 else (v1, v0)
                    term *= (x - there) / sympy.Integer(here - there)
                expr += term
            hit = self._memo[corner_values] = sympy.expand(expr)
        return hit
