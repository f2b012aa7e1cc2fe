"""A plan's step time as a sympy formula of named sizes (batch, sequence length, ...)."""
from __future__ import annotations

import ast
import re
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
    def from_json(d: dict) -> CostFormula:
        """Read with ``parse_expression``, never sympify: sympify evaluates its text as Python."""
        formula = CostFormula(dict(d["sizes"]), parse_expression(d["compute_s"]),
                              parse_expression(d["communication_s"]),
                              {k: parse_expression(v) for k, v in d["collective_bytes"].items()})
        unknown = {str(s) for e in [formula.compute_s, formula.communication_s, *formula.collective_bytes.values()]
                   for s in e.free_symbols} - set(formula.sizes)
        if unknown:
            raise ValueError(f"the formula names sizes {sorted(unknown)} that are not among {sorted(formula.sizes)}")
        return formula


# what sympy.srepr writes for the formulas' arithmetic: the only calls parse_expression builds
_CONSTRUCTORS = {name: getattr(sympy, name) for name in ("Add", "Mul", "Pow", "Integer", "Rational", "Max", "Min",
                                                         "ceiling", "floor", "Mod")}
_ASSUMPTIONS = frozenset({"positive", "integer", "real", "nonnegative", "finite"})
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)")


def parse_expression(text: str) -> sympy.Expr:
    """The expression ``sympy.srepr`` wrote, rebuilt from sympy's arithmetic, numbers and
    symbols alone (anything else is a ValueError): a plan file's formula is data, not code."""
    try:
        tree = ast.parse(text, mode="eval")
        return _built(tree.body)
    except (SyntaxError, RecursionError, TypeError) as exc:
        raise ValueError(f"not an expression srepr writes ({type(exc).__name__})") from exc


def _built(node):
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{ast.dump(node)[:60]} is not a call of sympy's arithmetic")
    name = node.func.id
    keywords = {k.arg: _constant(k.value) for k in node.keywords}
    if name == "Symbol":
        (symbol,) = [_constant(a) for a in node.args]
        if not isinstance(symbol, str) or not symbol.isidentifier() or set(keywords) - _ASSUMPTIONS:
            raise ValueError(f"Symbol({symbol!r}, {keywords}) is not a size's symbol")
        return sympy.Symbol(symbol, **{k: bool(v) for k, v in keywords.items()})
    if name == "Float":
        value = _constant(node.args[0])
        precision = keywords.get("precision", 53)
        if not isinstance(value, str) or not _NUMBER.fullmatch(value) or set(keywords) - {"precision"} \
                or not (isinstance(precision, int) and 1 <= precision <= 1024):
            raise ValueError(f"Float({value!r}, precision={precision!r}) is not a number")
        return sympy.Float(value, precision=precision)
    if name not in _CONSTRUCTORS or keywords:
        raise ValueError(f"{name} is not one of sympy's arithmetic constructors")
    args = [_constant(a) if isinstance(a, (ast.Constant, ast.UnaryOp)) else _built(a) for a in node.args]
    if name in ("Integer", "Rational") and not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        raise ValueError(f"{name}{tuple(args)} takes integers")
    return _CONSTRUCTORS[name](*args)


def _constant(node):
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):  # srepr writes Integer(-1)
        value = _constant(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if not isinstance(node, ast.Constant) or not isinstance(node.value, (str, int, float, bool)):
        raise ValueError("an argument that is not a constant")
    return node.value
