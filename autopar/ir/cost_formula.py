"""A plan's step time as a sympy formula of named sizes (batch, sequence length, ...)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import sympy

from autopar.errors import AutoparError


@dataclass(frozen=True)
class CostFormula:
    sizes: dict[str, int]  # the planning value of each named size
    compute_s: sympy.Expr
    communication_s: sympy.Expr
    collective_bytes: dict[str, sympy.Expr] = field(default_factory=dict)  # "r3.0" -> bytes of that step

    @property
    def step_time_s(self) -> sympy.Expr:
        return self.compute_s + self.communication_s

    @property
    def symbols(self) -> dict[str, sympy.Symbol]:
        return {name: sympy.Symbol(name, positive=True, integer=True) for name in self.sizes}

    @cached_property
    def _step_fn(self):
        return sympy.lambdify(list(self.symbols.values()), self.step_time_s, "math")

    def evaluate(self, **sizes: int) -> float:
        """Step time in seconds at ``sizes``; a size left out keeps its planning value."""
        unknown = sorted(set(sizes) - set(self.sizes))
        if unknown:
            raise AutoparError(f"unknown size(s) {unknown}; this plan's formula is in {sorted(self.sizes)}")
        values = {**self.sizes, **sizes}
        for name, v in values.items():
            if not (isinstance(v, int) and v > 0):
                raise AutoparError(f"size {name}={v!r} must be a positive integer")
        return float(self._step_fn(*(values[n] for n in self.sizes)))

    def to_json(self) -> dict:
        # srepr keeps every float bit, so a loaded plan evaluates to the same numbers
        return {"sizes": self.sizes, "compute_s": sympy.srepr(self.compute_s),
                "communication_s": sympy.srepr(self.communication_s),
                "collective_bytes": {k: sympy.srepr(v) for k, v in self.collective_bytes.items()}}

    @staticmethod
    def from_json(d: dict) -> "CostFormula":
        return CostFormula(dict(d["sizes"]), sympy.sympify(d["compute_s"]), sympy.sympify(d["communication_s"]),
                           {k: sympy.sympify(v) for k, v in d["collective_bytes"].items()})
