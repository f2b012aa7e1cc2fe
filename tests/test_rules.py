"""Sharding rules on hand-picked calls, each strategy run on the simulated ranks of a 2 x 2 mesh
(autopar.validate_rule): the cases where a rule once computed something else, and the harness
itself, which must name a broken rule and its strategy."""
import pytest
import torch

import autopar
from autopar.ir.placement import Partial, Replicate, Shard
from autopar.ir.strategy import Option
from autopar.ops.kinds import OpCall, Rule, pointwise
from autopar.ops.nn import _conv_flops, _ConvRule
from autopar.ops.table import rule_for

aten = torch.ops.aten


def check(op, *args, rule=None, **kwargs) -> autopar.RuleReport:
    """Every strategy of ``op``'s rule on this call equals the op; returns the report."""
    report = autopar.validate_rule(op, [(args, kwargs)], rule=rule)
    assert report.ok, str(report)
    return report


def offered(op, *args, low_precision_partials=False, **kwargs) -> list[Option]:
    tensors = [t for a in args for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]
    out = op(*args, **kwargs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    call = OpCall(op, args, kwargs, tuple(tuple(t.shape) for t in tensors), tuple(tuple(o.shape) for o in outs),
                  tuple(t.is_floating_point() for t in tensors), tuple(str(t.dtype)[6:] for t in tensors),
                  tuple(str(o.dtype)[6:] for o in outs), low_precision_partials)
    return rule_for(op).options(call)


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("groups", [2, 4, 16])
@pytest.mark.parametrize("transposed", [False, True])
def test_grouped_convolution_splits_whole_groups_forward_and_backward(groups, transposed):
    """groups=16 is depthwise: one input channel a group. A split of the channels is a split of
    the groups, and each rank runs its share of them."""
    x = randn(4, 16, 6, 6)
    weight = randn(16, 16 // groups, 3, 3)
    bias = randn(16)
    args = (x, weight, bias, [1, 1], [1, 1], [1, 1], transposed, [0, 0], groups)
    out = aten.convolution.default(*args)
    forward = check(aten.convolution.default, *args)
    channel_splits = [o for o in offered(aten.convolution.default, *args) if o.inputs[0] == Shard(1)]
    assert channel_splits and all(o.inputs[1] == Shard(0) and o.outputs[0] == Shard(1) for o in channel_splits)
    backward = check(aten.convolution_backward.default, randn(*out.shape), x, weight, [16], [1, 1], [1, 1], [1, 1],
                     transposed, [0, 0], groups, [True, True, True])
    assert forward.strategies > 4 and backward.strategies > 4


def test_a_convolution_rule_that_keeps_the_global_group_count_fails_by_name():
    class GroupsKept(_ConvRule):
        def local_args(self, call, local):
            return list(call.args)

    args = (randn(4, 16, 6, 6), randn(16, 1, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 16)
    report = autopar.validate_rule(aten.convolution.default, [(args, {})],
                                   rule=GroupsKept(backward=False, flop_fn=_conv_flops))
    assert not report.ok
    failure = report.failures[0]
    assert failure.op == "aten.convolution.default" and "S(1)" in failure.strategy
    assert "local op raises" in failure.problem and "groups" in failure.problem


def test_a_reduction_split_without_a_partial_sum_fails_by_name():
    class SplitSumReplicated(Rule):
        def options(self, call):
            return [Option((Replicate(),), (Replicate(),)), Option((Shard(0),), (Replicate(),))]

    report = autopar.validate_rule(aten.sum.default, [((randn(8, 4),), {})], rule=SplitSumReplicated())
    assert report.failures and all(f.op == "aten.sum.default" for f in report.failures)
    assert all("S(0)" in f.strategy.split("->")[0] and "differs" in f.problem for f in report.failures)
    assert report.strategies == len(report.failures) + 1  # only the replicated strategy computes the sum


def test_gather_and_scatter_split_a_dim_only_where_their_operands_agree():
    """The index addresses rows by global position: where it has fewer rows than the source,
    a rank holding the index's second half would read the source's first rows."""
    source = randn(8, 6)
    index = torch.randint(0, 6, (4, 3))  # fewer rows than the source, along dim 0 (not gathered)
    report = check(aten.gather.default, source, 1, index)
    assert report.strategies > 1
    assert not any(o.inputs[1] == Shard(0) for o in offered(aten.gather.default, source, 1, index))
    check(aten.scatter.src, torch.zeros(8, 6, dtype=torch.float64), 1, index, randn(4, 5))
    check(aten.scatter_add.default, randn(8, 6), 1, index, randn(4, 5))
    check(aten.scatter_reduce.two, randn(8, 6), 1, index, randn(4, 3), "sum")
    same_rows = torch.randint(0, 6, (8, 3))
    assert any(o.inputs[1] == Shard(0) for o in offered(aten.gather.default, source, 1, same_rows))


def test_histc_over_the_datas_own_range_stays_whole():
    data = randn(8, 6)
    data_range = offered(aten.histc.default, data, 4)  # min = max = 0: the data's own min and max
    assert all(all(p == Replicate() for p in o.inputs) for o in data_range)
    check(aten.histc.default, data, 4)
    fixed_range = check(aten.histc.default, data, 4, -1.0, 1.0)
    assert fixed_range.strategies > 1


def test_frequency_scaled_embedding_gradient_keeps_its_indices_whole():
    grad, indices = randn(4, 6, 8), torch.randint(0, 5, (4, 6))
    scaled = offered(aten.embedding_dense_backward.default, grad, indices, 10, -1, True)
    assert not any(isinstance(p, Shard) for o in scaled for p in o.inputs[1:])
    assert any(o.inputs[0] == Shard(2) for o in scaled)  # the embedding dim still splits
    check(aten.embedding_dense_backward.default, grad, indices, 10, -1, True)
    plain = offered(aten.embedding_dense_backward.default, grad, indices, 10, -1, False)
    assert any(o.inputs[1] == Shard(0) and o.outputs[0] == Partial() for o in plain)
    check(aten.embedding_dense_backward.default, grad, indices, 10, -1, False)


def test_a_cast_down_takes_a_partial_sum_only_where_the_precision_allows_it():
    x = randn(8, 6)
    cast = aten._to_copy.default
    assert not any(Partial() in o.inputs for o in offered(cast, x, dtype=torch.bfloat16))
    check(cast, x, dtype=torch.bfloat16)
    assert any(Partial() in o.inputs for o in offered(cast, x, dtype=torch.float64))  # no rounding: fine
    # MixedPrecision(reduce="bf16") accepts sums rounded to bf16: then the strategy is offered,
    # and it is lossy by construction (each summand rounded before the sum), which the harness shows
    assert any(Partial() in o.inputs for o in offered(cast, x, dtype=torch.bfloat16, low_precision_partials=True))
    lossy = autopar.validate_rule(cast, [((x,), {"dtype": torch.bfloat16})], low_precision_partials=True)
    assert lossy.failures and all("P" in f.strategy.split("->")[0] for f in lossy.failures)


def test_squeeze_runs_as_a_reshape_so_a_block_of_size_one_keeps_its_dim():
    """squeeze(-1) of a (1, 2) tensor changes nothing; a rank's (1, 1) block would lose a dim."""
    check(aten.squeeze.dim, randn(1, 2), -1)
    check(aten.squeeze.default, randn(4, 2, 1))
    check(aten.squeeze.dims, randn(2, 1, 4), [1, 2])


def test_index_gathers_rows_with_any_operand_sharded():
    x = randn(6, 4, 8)
    check(aten.index.Tensor, x, [None, torch.randint(0, 4, (10,))])
    check(aten.index.Tensor, x, [torch.randint(0, 6, (4, 2))])


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_writes_rows_with_any_operand_sharded(accumulate):
    idx = torch.randperm(8)[:4] if not accumulate else torch.randint(0, 8, (4,))
    check(aten.index_put.default, randn(8, 6), [idx], randn(4, 6), accumulate)


def test_routing_ops():
    idx = randn(8, 4).topk(2, dim=-1).indices
    check(aten.scatter.src, torch.zeros(8, 4, dtype=torch.float64), -1, idx, randn(8, 2))
    check(aten.topk.default, randn(8, 6), 2)
    check(aten.sort.default, randn(4, 6), 0)
    check(aten.cumsum.default, randn(4, 6), 1)
    check(aten.floor_divide.default, torch.randint(0, 9, (4, 6)), 2)


def test_safe_softmax_keeps_its_dim_whole_and_fully_masked_rows_zero():
    scores = randn(4, 2, 6, 6)
    scores[0, 1, 2] = float("-inf")  # a fully masked query row: zeros, not NaN
    check(aten._safe_softmax.default, scores, -1)


def test_sort_of_a_vector_is_replicated_only():
    options = offered(aten.sort.default, randn(8))
    assert all(all(isinstance(p, Replicate) for p in o.inputs + o.outputs) for o in options)


def test_transformers_grouped_mm_splits_features_not_rows():
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the op)

    experts, rows, k, n = 3, 12, 4, 6
    offs = torch.tensor([5, 0, 7]).cumsum(0).to(torch.int32)
    x, w = randn(rows, k), randn(experts, k, n)
    check(torch.ops.transformers.grouped_mm_fallback.default, x, w, offs)
    check(torch.ops.transformers.grouped_mm_fallback_backward.default, x, w, offs, randn(rows, n))


def test_a_users_custom_op_rule_is_validated_by_the_same_harness(monkeypatch):
    from autopar.ops.table import RULES
    from examples import custom_op

    for op in (torch.ops.autopar_examples.scaled_silu.default, torch.ops.autopar_examples.scaled_silu_backward.default):
        monkeypatch.setitem(RULES, op, None)  # taken back after the test: later plans are cached again
    custom_op.register_rules()
    x = randn(8, 6)
    report = autopar.validate_rule(torch.ops.autopar_examples.scaled_silu.default, [((x, 1.5), {})])
    assert report.ok and report.strategies > 4, str(report)
    wrong = autopar.validate_rule(torch.ops.autopar_examples.scaled_silu.default, [((x, 1.5), {})],
                                  rule=pointwise(linear="first"))  # it is not linear
    assert not wrong.ok and "P" in wrong.failures[0].strategy


def test_an_op_without_a_rule_is_named():
    with pytest.raises(autopar.AutoparError, match="logcumsumexp.*no sharding rule"):
        autopar.validate_rule(aten.logcumsumexp.default, [((randn(4, 4), 0), {})])


def test_cat_with_an_empty_legacy_operand_splits_the_others_dims():
    """A Hugging Face key cache starts as torch.tensor([]) and is joined with the keys on the
    sequence dim: the batch and head dims stay splittable (they were once all gathered)."""
    keys = randn(4, 2, 6, 3)
    check(aten.cat.default, [torch.tensor([], dtype=torch.float64), keys], -2)
    splits = {o.outputs[0].dim for o in offered(aten.cat.default, [torch.tensor([]), torch.randn(4, 2, 6, 3)], -2)
              if isinstance(o.outputs[0], Shard)}
    assert splits == {0, 1, 3}
