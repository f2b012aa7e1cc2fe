"""The composition matrix (tests/composition.py): every pair of features either trains equal to
eager on four gloo ranks, inside one of the runs that combine several features at once, or is
refused with the message the table states; the docs' matrix is the table's."""
from __future__ import annotations

import itertools
import os
import pathlib

import pytest

from tests import composition
from tests.composition import FEATURES, NOT_EXPRESSIBLE, REFUSED, STACK

RUNS = composition.cover()

DOCS = pathlib.Path(__file__).parent.parent / "docs" / "composition.md"


def test_every_pair_is_run_refused_or_said_to_be_inexpressible():
    """The runs and the torchtitan stack's cover every pair the tables do not refuse; a run
    holds no refused or inexpressible pair (it would test nothing past the refusal) and fits
    four ranks."""
    covered = {frozenset(p) for run in RUNS + [STACK] for p in itertools.combinations(run, 2)}
    for a, b in itertools.combinations(FEATURES, 2):
        pair = frozenset({a, b})
        assert (pair in covered) + (pair in REFUSED) + (pair in NOT_EXPRESSIBLE) == 1, (a, b)
    for run in RUNS:
        assert set(run) <= set(FEATURES)
        assert composition.ranks_of(composition.mesh_of(run)) == composition.RANKS, sorted(run)
    assert composition.mesh_of(STACK) == "pp=2,dp=2,tp=2"


@pytest.mark.slow  # each run plans, trains two steps on four ranks and eager
@pytest.mark.parametrize("run", RUNS, ids=["+".join(sorted(run)) for run in RUNS])
def test_a_run_of_several_features_trains_equal_to_eager(run):
    outcome = composition.run_recipe(run)
    assert outcome.error is None, outcome.error
    assert not outcome.missing, f"the plan does not show {outcome.missing}"
    assert outcome.worst <= 1.0, f"{sorted(run)}: {outcome.worst:.3g} tolerances from eager"


@pytest.mark.slow
def test_torchtitans_stack_trains_equal_to_eager():
    """ZeRO-3 + TP + PP + bf16 + compile + recompute + DCP + clipping in one run on eight ranks
    (pp=2,dp=2,tp=2): equal to eager, every feature in the plan."""
    outcome = composition.run_recipe(STACK)
    assert outcome.error is None and outcome.worst <= 1.0, outcome
    assert not outcome.missing, outcome


_REFUSED_PAIRS = sorted(REFUSED, key=sorted)


@pytest.mark.slow  # some refusals come from the ranks, after planning and starting the run
@pytest.mark.parametrize("pair", _REFUSED_PAIRS, ids=["+".join(sorted(p)) for p in _REFUSED_PAIRS])
def test_a_refused_pair_is_refused_with_its_reason(pair):
    outcome = composition.run_recipe(pair)
    assert outcome.error is not None and REFUSED[pair][0] in outcome.error, outcome.error


def test_the_docs_show_the_tables_matrix():
    text = composition.matrix_markdown()
    if os.environ.get("AUTOPAR_REGENERATE_DOCS"):
        DOCS.write_text(DOCS.read_text().split("<!-- matrix -->")[0] + "<!-- matrix -->\n\n" + text)
    assert DOCS.read_text().split("<!-- matrix -->\n\n", 1)[1] == text
