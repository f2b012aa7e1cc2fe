"""Every entry of the JAX backend's translation table against torch, on PyTorch's own OpInfo
sample inputs, dtype by dtype: a translation without a passing sample is not in the table."""
import pytest

pytest.importorskip("jax", reason="jax is a test dependency: pip install -e '.[test]'")
pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest: pip install -e '.[test]'")

import torch  # noqa: E402

from autopar.backends.jax.aten import TABLE  # noqa: E402
from tests.op_samples import DTYPES, Call, close, recorded_calls, to_jax  # noqa: E402

# outputs whose values torch leaves undefined (uninitialized memory): only shape and dtype count
SHAPE_ONLY = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
              "aten.empty_permuted.default", "aten.new_empty.default", "aten.new_empty_strided.default"}
# (values, indices) whose indices may pick any of equal values: the indices must select the values
SELECTIONS = {"aten.sort.default", "aten.topk.default", "aten.max.dim", "aten.min.dim"}


def _outputs(value) -> list:
    if isinstance(value, (tuple, list)):
        return [v for item in value for v in _outputs(item)]
    return [value]


def _jax_inputs(call: Call) -> tuple[tuple, dict]:
    args, kwargs = to_jax(call.args), {k: to_jax(v) for k, v in call.kwargs.items()}
    if call.target == "aten.native_dropout.default":  # the program passes the mask it drew: here torch's
        kwargs["mask"] = to_jax(call.out[1])
    return args, kwargs


def _mismatches(calls: list[Call]) -> list[str | None]:
    """What differs from torch in each call's translation (None where nothing does). The calls
    are compiled as one program (a compile per sample was most of this test's time); where that
    raises, one by one, so that the sample whose translation raises is named."""
    try:
        results = _jitted([(TABLE[call.target], *_jax_inputs(call)) for call in calls])
    except Exception:  # noqa: BLE001 - each call again, alone, to tell which one raises
        return [_alone(call) for call in calls]
    return [_compared(call, result) for call, result in zip(calls, results)]


def _alone(call: Call) -> str | None:
    try:
        (result,) = _jitted([(TABLE[call.target], *_jax_inputs(call))])
    except Exception as e:  # a translation that raises on torch's own sample is wrong
        return f"raised {type(e).__name__}: {str(e)[:200]}"
    return _compared(call, result)


def _compared(call: Call, result) -> str | None:
    import jax.numpy as jnp

    mine = _outputs(result)
    theirs = _outputs(call.out)
    if len(mine) != len(theirs):
        return f"{len(mine)} outputs, torch {len(theirs)}"
    if call.target in SELECTIONS:
        x, dim = call.args[0], (call.args[1] if len(call.args) > 1 else call.kwargs.get("dim", -1))
        if call.target == "aten.topk.default":
            dim = call.args[2] if len(call.args) > 2 else call.kwargs.get("dim", -1)
        if x.ndim:
            picked = jnp.take_along_axis(jnp.asarray(to_jax(x)), mine[1].reshape(_keepdim(mine[1], x, dim)),
                                         axis=dim % x.ndim)
            problem = close(picked.reshape(mine[0].shape), theirs[0])
            if problem:
                return f"indices do not select the values: {problem}"
        return close(mine[0], theirs[0])
    for ours, expected in zip(mine, theirs):
        if expected is None or not isinstance(expected, torch.Tensor):
            continue
        if call.target in SHAPE_ONLY:
            if tuple(ours.shape) != tuple(expected.shape):
                return f"shape {ours.shape} != torch's {tuple(expected.shape)}"
            continue
        problem = close(ours, expected)
        if problem:
            return problem
    return None


def _jitted(work: list[tuple]) -> list:
    """``function(*args, **kwargs)`` of each ``(function, args, kwargs)``, in one function under
    jax.jit, as the emitted program runs them: the arrays traced, every other argument (sizes,
    dims, flags, dtypes) static."""
    import jax

    flat = [jax.tree_util.tree_flatten((args, kwargs)) for _, args, kwargs in work]
    traced = [[i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)] for leaves, _ in flat]

    def run(*arrays_of_each):
        results = []
        for (function, _, _), (leaves, tree), places, arrays in zip(work, flat, traced, arrays_of_each):
            filled = list(leaves)
            for i, array in zip(places, arrays):
                filled[i] = array
            a, k = jax.tree_util.tree_unflatten(tree, filled)
            results.append(function(*a, **k))
        return results

    return jax.jit(run)(*[[leaves[i] for i in places] for (leaves, _), places in zip(flat, traced)])


def _keepdim(indices, x, dim):
    shape = list(indices.shape)
    if len(shape) < x.ndim:  # max.dim without keepdim: put the reduced axis back for take_along_axis
        shape.insert(dim % x.ndim, 1)
    return shape


def _data_dependent(call: Call) -> bool:
    """x[mask]: its output's length is the mask's count of True, which a compiled (jit) program
    cannot have; capture refuses such shapes, so no emitted program calls it."""
    return call.target == "aten.index.Tensor" and any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in call.args[1])


@pytest.mark.slow  # about 10k OpInfo samples, compiled a target and dtype at a time
@pytest.mark.parametrize("target", sorted(TABLE))
def test_translation_matches_torch_on_opinfo_samples(target):
    tried, failures = {}, []
    for dtype in DTYPES:
        calls = [call for call in recorded_calls(target, dtype) if not _data_dependent(call)]
        if calls:
            tried[dtype] = len(calls)
        for call, problem in zip(calls, _mismatches(calls)):
            if problem:
                shapes = [tuple(a.shape) for a in call.args if isinstance(a, torch.Tensor)]
                others = [a for a in call.args if not isinstance(a, torch.Tensor)]
                failures.append(f"{dtype} inputs {shapes} args {others} {call.kwargs}: {problem}")
    assert tried, f"no OpInfo sample reaches {target}: add the OpInfo that does to tests.op_samples.py"
    assert not failures, f"{len(failures)} of {sum(tried.values())} samples differ:\n" + "\n".join(failures[:8])


def test_helper_names_are_unique_across_the_translation_modules():
    """The emitted module carries each helper's source under its own name: two modules' different
    functions of one name would leave only one of them there."""
    import types

    from autopar.backends.jax.aten.table import _MODULES

    seen: dict = {}
    for module in _MODULES:
        for name, value in vars(module).items():
            if isinstance(value, types.FunctionType):
                assert seen.setdefault(name, value) is value, f"{name} is defined in two translation modules"


def test_every_op_with_a_sharding_rule_has_a_translation():
    """An op the planner shards is one the JAX program can run, without a decomposition (an op
    replicated for a stated reason, such as a data-dependent shape, need not be one)."""
    from autopar.ops.indexing import NAMED_RULES
    from autopar.ops.kinds import ReplicateOnly
    from autopar.ops.table import RULES

    sharded = {str(op) for op, rule in RULES.items() if not isinstance(rule, ReplicateOnly)}
    assert sorted((sharded | set(NAMED_RULES)) - set(TABLE)) == []


def test_as_strided_that_is_no_view_is_refused_by_name():
    """Overlapping windows (as unfold makes them) are not a slice, transpose or expand."""
    import jax.numpy as jnp

    with pytest.raises(ValueError, match=r"as_strided with sizes \[3, 3\], strides \[1, 1\].*not a slice"):
        TABLE["aten.as_strided.default"](jnp.arange(6.0), [3, 3], [1, 1], 0)
