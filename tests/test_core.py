import pytest

from autopar import Mesh, MeshError
from autopar.ir.placement import P, R, Shard, Spec
from autopar.ir.redistribute import plan_steps
from autopar.ops.kinds import view_groups


def test_mesh_parse_and_coords():
    mesh = Mesh.parse("dp=2,tp=4")
    assert mesh == Mesh.of(dp=2, tp=4) == Mesh.parse({"dp": 2, "tp": 4})
    assert mesh.size == 8
    assert [mesh.coords(r) for r in (0, 1, 4, 7)] == [(0, 0), (0, 1), (1, 0), (1, 3)]


@pytest.mark.parametrize("bad", ["dp", "dp=x", "dp=0", "dp=2,dp=2"])
def test_mesh_rejects_bad_text(bad):
    with pytest.raises(MeshError):
        Mesh.parse(bad)


def test_mesh_world_size_mismatch_names_both_sizes():
    with pytest.raises(MeshError, match="4 devices but the process group has 2 ranks"):
        Mesh.of(dp=2, tp=2).check_world_size(2)


def test_spec_local_shape_and_json():
    mesh = Mesh.of(dp=2, tp=4)
    spec = Spec((Shard(0), Shard(1)))
    assert spec.local_shape((8, 16, 3), mesh) == (4, 4, 3)
    assert Spec.from_json(spec.to_json()) == spec
    assert str(Spec((R, P))) == "(R, P)"
    assert spec.to_partition_spec(mesh, 3) == ("dp", "tp", None)


def test_view_groups_pair_merged_and_split_dims():
    assert view_groups((2, 8, 16), (16, 16)) == [([0, 1], [0]), ([2], [1])]
    assert view_groups((16, 16), (2, 8, 4, 4)) == [([0], [0, 1]), ([1], [2, 3])]


@pytest.mark.parametrize("src,dst,kinds", [
    ((P,), (R,), ["all_reduce"]),
    ((P,), (Shard(0),), ["reduce_scatter"]),
    ((Shard(0),), (R,), ["all_gather"]),
    ((Shard(0),), (Shard(1),), ["all_to_all"]),
    ((R,), (Shard(1),), ["shard"]),
    ((R,), (P,), ["zero_partial"]),
    # the gather on dp must come before the local slice on tp of the same dim
    ((Shard(0), R), (R, Shard(0)), ["all_gather", "shard"]),
])
def test_redistribution_steps(src, dst, kinds):
    steps = plan_steps(Spec(src), Spec(dst))
    assert [s.kind for s in steps] == kinds


def test_spec_converts_to_dtensor_placements():
    from torch.distributed.tensor import placement_types as pt

    assert Spec((Shard(1), R, P)).to_dtensor() == (pt.Shard(1), pt.Replicate(), pt.Partial())


def test_adding_a_constant_to_a_partial_sum_is_not_linear():
    """x + 1.0 on partial sums would add the constant once per rank."""
    import torch

    from autopar.ops.kinds import OpCall
    from autopar.ops.table import RULES

    add = torch.ops.aten.add.Tensor
    tensor_plus_number = OpCall(add, ("x", 1.0), {}, ((4, 4),), ((4, 4),), (True,))
    assert all(P not in o.inputs for o in RULES[add].options(tensor_plus_number))
    tensor_plus_tensor = OpCall(add, ("x", "y"), {}, ((4, 4), (4, 4)), ((4, 4),), (True, True))
    assert any(o.inputs == (P, P) and o.outputs == (P,) for o in RULES[add].options(tensor_plus_tensor))
    div = torch.ops.aten.div.Tensor
    number_over_tensor = OpCall(div, (2.0, "x"), {}, ((4, 4),), ((4, 4),), (True,))
    assert all(P not in o.inputs for o in RULES[div].options(number_over_tensor))


def test_an_op_given_a_rule_after_a_capture_is_no_longer_decomposed(monkeypatch):
    """capture_decompositions keeps torch's table once per process, yet reads the rules on every
    capture: a rule registered since keeps its op whole."""
    from autopar.capture.canonicalize import capture_decompositions
    from autopar.ops.kinds import unary
    from autopar.ops.table import RULES

    decomposed = next(op for op in capture_decompositions() if op not in RULES)
    monkeypatch.setitem(RULES, decomposed, unary())  # what autopar.register_rule does
    assert decomposed not in capture_decompositions()


def test_capture_leaves_fxs_stack_trace_setting_as_it_found_it():
    from torch import fx

    from autopar.capture.export import capture
    from examples import gpt2

    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=32, seq=8, layers=1, heads=2, width=16, batch=2))
    assert fx.config.do_not_emit_stack_traces is False
    capture(model, inputs)
    assert fx.config.do_not_emit_stack_traces is False
