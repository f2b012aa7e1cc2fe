"""Every strategy of every sharding rule, run on simulated ranks of a 2 x 2 mesh and compared
with the op on whole tensors (autopar.ops.validation), on PyTorch's OpInfo samples: the
guard against a plan whose step computes something else than eager's."""
from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest: pip install -e '.[test]'")

from autopar.ops.coverage import op_name, tagged_pointwise_ops  # noqa: E402
from autopar.ops.indexing import NAMED_RULES  # noqa: E402
from autopar.ops.table import RULES  # noqa: E402
from autopar.ops.validation import validate_rule  # noqa: E402
from tests.op_samples import (  # noqa: E402
    DERIVED,
    GENERATED,
    _derived_calls,
    calls_of_every_opinfo,
    schema_calls,
)

PER_OP = 6
DTYPES = (torch.float64, torch.int64, torch.bool, torch.complex128)
# ops whose rule the harness cannot run, and why (each is checked elsewhere)
NOT_RUN = {
    "aten.native_dropout.default": "random: the runtime draws the mask for the whole tensor and keeps each rank's "
                                   "block (tests/test_equivalence.py::test_dropout_masks_match_eager_when_sharded)",
}


def _ops() -> dict:
    ops = {op_name(op): op for op in RULES}
    ops.update({op_name(op): op for op in tagged_pointwise_ops()})
    try:
        import transformers.integrations.moe  # noqa: F401  (registers the library's ops)
        ops.update({name: _library_op(name) for name in NAMED_RULES})
    except ImportError:
        pass
    return {name: op for name, op in sorted(ops.items()) if name not in NOT_RUN}


def _library_op(name: str):
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


OPS = _ops()


@functools.cache
def _samples() -> dict:
    found: dict = {}
    for dtype in DTYPES:
        short = {t for t in OPS if len(found.get(t, [])) < PER_OP}
        for target, calls in calls_of_every_opinfo(dtype, short, PER_OP).items():
            found[target] = (found.get(target, []) + calls)[:PER_OP]
    for target in (t for t in OPS if not found.get(t)):
        found[target] = _made_calls(target, found)
    return found


def _made_calls(target: str, found: dict) -> list:
    """Calls of an op no OpInfo sample reaches: from a sibling's samples, by hand, or from its schema."""
    if target in DERIVED:
        calls = _derived_calls(target, torch.float64, sources=found.get(DERIVED[target][0], []))
        if calls:
            return calls
    if target in GENERATED:
        return GENERATED[target](torch.float64)
    return schema_calls(OPS[target])


@pytest.mark.slow  # every OpInfo's samples recorded, then about 25k strategies run on 4 simulated ranks
@pytest.mark.parametrize("target", list(OPS))
def test_every_strategy_of_the_rule_computes_the_op(target):
    samples = _samples()[target]
    assert samples, f"no sample reaches {target}: add one to tests/op_samples.py"
    report = validate_rule(OPS[target], samples)
    assert report.ok, str(report)
    assert report.strategies > 0, str(report)


def test_every_core_aten_op_has_a_rule_or_a_stated_reason():
    from autopar.ops.coverage import coverage

    found = coverage()
    print(found)  # the list the docs and the issue notes quote (pytest -s shows it)
    assert not found.missing, str(found)
    assert len(found.sharded) + len(found.replicated) + len(found.unneeded) == len(found.ops)
    assert all(found.replicated.values()) and all(found.unneeded.values())
    assert len(found.sharded) >= 170
