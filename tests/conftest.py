import dataclasses
import os

import pytest

# XLA compiles the JAX programs and translations the tests run without LLVM's costly passes: the
# tests check values, not speed, and the compiles are most of their time (about a fifth less)
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

from autopar.cost_models.hardware import PRESETS, Link

# Whole runs of minutes each (compiling on four to eight ranks, torchrun jobs) start first, longest
# processing time first: pytest-xdist then hands the short tests to whichever worker is free, and
# the two workers finish together, where one started late would run alone at the end
_LONG_RUNS_FIRST = ("tests/test_composition.py", "tests/test_examples.py", "tests/test_compile.py",
                    "tests/test_elastic.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith(_LONG_RUNS_FIRST))  # stable: file order otherwise


@pytest.fixture(scope="session", autouse=True)
def fresh_plan_cache(tmp_path_factory):
    """One empty plan cache for the run (worker processes inherit it): no test reads the
    user's cache or stale entries, and tests still share what earlier tests planned, across
    pytest-xdist's workers too (the run's temporary directory is theirs in common; entries are
    written whole, then renamed into place)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "plan-cache"
    shared.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOPAR_CACHE_DIR", str(shared))
        yield


@pytest.fixture(scope="session")
def fast_network():
    """An H100 whose links are 1000x faster and kernels have no launch floor or small-size penalty.

    On it sharding almost always pays, so small models (cheap to run on CPU)
    get heavily sharded plans and the equivalence tests exercise real
    collectives instead of a replicated plan.
    """
    h100 = PRESETS["h100-sxm"]
    return dataclasses.replace(h100, name="h100-fast-network", intra_node=Link(450e12, 1e-9),
                               inter_node=Link(450e12, 1e-9), kernel_floor_s=0.0,
                               half_efficiency_flops=0.0, collectives_library="gloo")
