"""The inner loop's share of a parametrized matrix (the full suite runs all of it)."""
from __future__ import annotations

import pytest


def sampled(cases: list, inner_loop: list) -> list:
    """``cases`` for ``pytest.mark.parametrize``, each not in ``inner_loop`` marked slow: the inner
    loop (``-m "not slow"``) runs a sample chosen to cover every value of each axis once."""
    missing = [case for case in inner_loop if case not in cases]
    assert not missing, f"inner-loop cases {missing} are not in the matrix"
    return [case if case in inner_loop else
            pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
            for case in cases]
