"""Each sharding rule, run for real: every option it offers, simulated on two ranks
(shards cut, partial sums split at random), must reassemble to the op's global result."""
import pytest
import torch

from autopar.ir.placement import Partial, Replicate, Shard
from autopar.ops.kinds import OpCall
from autopar.ops.table import rule_for

aten = torch.ops.aten
RANKS = 2


def _tensors(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out


def _replace(args, it):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(next(it))
        elif isinstance(a, (list, tuple)):
            out.append(type(a)(_replace(a, it)))
        else:
            out.append(a)
    return out


def _split(t: torch.Tensor, placement) -> list:
    if isinstance(placement, Shard):
        return list(t.chunk(RANKS, placement.dim))
    if isinstance(placement, Partial):
        noise = torch.randn_like(t)
        return [t - noise, noise]
    return [t] * RANKS


def _join(parts: list, placement) -> torch.Tensor:
    if isinstance(placement, Shard):
        return torch.cat(parts, placement.dim)
    if isinstance(placement, Partial):
        return sum(parts[1:], parts[0])
    assert isinstance(placement, Replicate)
    for p in parts[1:]:
        torch.testing.assert_close(p, parts[0])  # a replicated output must agree on every rank
    return parts[0]


def _outputs(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def check_every_option(op, *args, rule=None, **kwargs):
    rule = rule or rule_for(op)
    tensors = _tensors(args)
    expected = _outputs(op(*args, **kwargs))
    call = OpCall(op, tuple(args), kwargs, tuple(tuple(t.shape) for t in tensors),
                  tuple(tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in expected),
                  tuple(t.is_floating_point() for t in tensors))
    options = rule.options(call)
    assert len(options) > 1, "the rule offers nothing but replication"
    checked = 0
    for option in options:
        shapes_fit = all(not isinstance(p, Shard) or t.shape[p.dim] % RANKS == 0
                         for t, p in zip(tensors, option.inputs))
        if not shapes_fit or any(isinstance(p, Partial) and not t.is_floating_point()
                                 for t, p in zip(tensors, option.inputs)):
            continue
        pieces = [_split(t, p) for t, p in zip(tensors, option.inputs)]
        per_rank = [_outputs(op(*_replace(args, iter([pc[r] for pc in pieces])), **kwargs)) for r in range(RANKS)]
        for j, want in enumerate(expected):
            if isinstance(want, torch.Tensor):
                got = _join([outs[j] for outs in per_rank], option.outputs[j])
                torch.testing.assert_close(got.to(want.dtype), want, rtol=1e-5, atol=1e-5,
                                           msg=lambda m: f"{op} option {option}: {m}")
        checked += 1
    assert checked > 1


def test_index_gathers_rows_with_any_operand_sharded():
    x = torch.randn(6, 4, 8)
    idx = torch.randint(0, 4, (10,))
    check_every_option(aten.index.Tensor, x, [None, idx])
    check_every_option(aten.index.Tensor, x, [torch.randint(0, 6, (4, 2))])


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_writes_rows_with_any_operand_sharded(accumulate):
    x = torch.randn(8, 6)
    idx = torch.randperm(8)[:4] if not accumulate else torch.randint(0, 8, (4,))
    check_every_option(aten.index_put.default, x, [idx], torch.randn(4, 6), accumulate)


def test_scatter_and_routing_ops():
    x = torch.zeros(8, 4)
    idx = torch.randn(8, 4).topk(2, dim=-1).indices
    check_every_option(aten.scatter.src, x, -1, idx, torch.randn(8, 2))
    check_every_option(aten.topk.default, torch.randn(8, 6), 2)
    check_every_option(aten.sort.default, torch.randn(4, 6), 0)
    check_every_option(aten.cumsum.default, torch.randn(4, 6), 1)
    check_every_option(aten.histc.default, torch.randint(0, 4, (4, 8)).float(), 4, 0, 3)
    check_every_option(aten.floor_divide.default, torch.randint(0, 9, (4, 6)), 2)


def test_safe_softmax_keeps_its_dim_whole_and_fully_masked_rows_zero():
    scores = torch.randn(4, 2, 6, 6)
    scores[0, 1, 2] = float("-inf")  # a fully masked query row: zeros, not NaN
    check_every_option(aten._safe_softmax.default, scores, -1)


def test_sort_of_a_vector_is_replicated_only():
    v = torch.randn(8)
    call = OpCall(aten.sort.default, (v,), {}, ((8,),), ((8,), (8,)), (True,))
    options = rule_for(aten.sort.default).options(call)
    assert all(all(isinstance(p, Replicate) for p in o.inputs + o.outputs) for o in options)


def test_transformers_grouped_mm_splits_features_not_rows():
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the op)

    op = torch.ops.transformers.grouped_mm_fallback.default
    experts, rows, k, n = 3, 12, 4, 6
    counts = torch.tensor([5, 0, 7])
    offs = counts.cumsum(0).to(torch.int32)
    x, w = torch.randn(rows, k), torch.randn(experts, k, n)
    check_every_option(op, x, w, offs)
    backward = torch.ops.transformers.grouped_mm_fallback_backward.default
    check_every_option(backward, x, w, offs, torch.randn(rows, n))


def test_the_check_catches_a_wrong_rule():
    from autopar.ops.kinds import unary

    with pytest.raises(AssertionError):  # cumsum treated as elementwise: sharding its dim is wrong
        check_every_option(aten.cumsum.default, torch.randn(4, 6), 1, rule=unary())
