import dataclasses

import pytest

from autopar.cost_models.hardware import PRESETS, Link


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
