"""The extension API: users' passes (passes=, register_pass) and the solver constraints they add."""
import dataclasses

import pytest
import torch

import autopar
from autopar.errors import AutoparError
from autopar.ir.placement import Shard
from examples import gpt2, mlp
from examples.custom_pass import HeadsOnTP
from tests.workers import FAST


class Constrain(autopar.Pass):
    """A pass that applies ``add(ctx.constraints)``: the tests' way to say one thing each."""

    def __init__(self, add, name="constrain", **where):
        self.add, self.name = add, name
        for side, other in where.items():
            setattr(self, side, other)

    def run(self, program, ctx) -> str:
        self.add(ctx.constraints)
        return "added"


def attention_queries(plan, axis="tp"):
    tp = plan.mesh.axis_names.index(axis)
    return {n.name: plan.strategies[n.name].in_specs[0].placements[tp]
            for n in plan.graph.nodes if "scaled_dot_product" in n.target}


@pytest.fixture(scope="module")
def tiny():
    return gpt2.make("tiny")


def test_the_example_pass_puts_heads_on_tp_and_the_program_still_trains(tiny):
    model, inputs = tiny
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST, passes=[HeadsOnTP()])
    queries = attention_queries(plan)
    assert len(queries) == 4 and set(queries.values()) == {Shard(1)}  # forward and backward, both layers
    assert [r.name for r in plan.history].index("heads_on_tp") < [r.name for r in plan.history].index("cluster_layers")
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)


def test_a_forbid_is_obeyed_whichever_way_it_points(tiny):
    model, inputs = tiny
    tp = 1
    not_on_heads = Constrain(lambda c: c.forbid(lambda node, s: "scaled_dot_product" in str(node.target)
                                                and s.in_specs[0].placements[tp] == Shard(1)))
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST, passes=[not_on_heads])
    assert Shard(1) not in attention_queries(plan).values()


def test_registered_passes_run_in_every_plan_until_unregistered():
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    pass_ = autopar.register_pass(Constrain(lambda c: c.pin("fc1", "S(0)"), name="fc1_rows"), after="strategies")
    try:
        assert pass_ in autopar.registered_passes()
        plan = autopar.plan(model, inputs, mesh="tp=4", hardware=FAST)
        # "fc1" is a module: both its parameters take the pin
        assert str(plan.param_spec("fc1.weight")) == str(plan.param_spec("fc1.bias")) == "(S(0))"
        assert [r.name for r in plan.history][:3] == ["shapes", "strategies", "fc1_rows"]
    finally:
        autopar.unregister_pass("fc1_rows")
    assert "fc1_rows" not in [r.name for r in autopar.plan(model, inputs, mesh="tp=4", hardware=FAST).history]
    with pytest.raises(AutoparError, match="no registered pass 'fc1_rows'"):
        autopar.unregister_pass("fc1_rows")


def test_misplaced_or_malformed_passes_fail_before_any_work():
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    with pytest.raises(AutoparError, match="no such pass; the passes are shapes, strategies"):
        autopar.plan(model, inputs, mesh="tp=4", passes=[Constrain(lambda c: None, before="solve")])
    with pytest.raises(AutoparError, match="autopar.Pass instance"):
        autopar.plan(model, inputs, mesh="tp=4", passes=[lambda program, ctx: None])
    with pytest.raises(AutoparError, match="no such pass"):  # autoparallelize takes passes= too
        autopar.autoparallelize(model, mesh="tp=4", passes=[Constrain(lambda c: None, after="solve")])
    with pytest.raises(AutoparError, match="cannot pin 'fc3'.*no parameter, module or node"):
        autopar.plan(model, inputs, mesh="tp=4", hardware=FAST, passes=[Constrain(lambda c: c.pin("fc3", "R"))])
    with pytest.raises(AutoparError, match="rule out every layout"):
        autopar.plan(model, inputs, mesh="tp=4", hardware=FAST,
                     passes=[Constrain(lambda c: c.forbid(lambda node, s: node.name == "addmm"))])


def test_a_forbidden_collective_never_appears():
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    free = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST)
    assert any(free.mesh.axis_names[r.steps[i].axis] == "tp" for r, i in free.collectives())  # not vacuous
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST,
                        passes=[Constrain(lambda c: c.forbid_collective("tp"))])
    assert not [r for r, i in plan.collectives() if plan.mesh.axis_names[r.steps[i].axis] == "tp"]
    assert plan.predicted.step_time_s >= free.predicted.step_time_s
    with pytest.raises(AutoparError, match="mesh \\(dp=2, tp=2\\) has axes dp, tp"):
        autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST,
                     passes=[Constrain(lambda c: c.forbid_collective("pp"))])


def test_a_memory_cap_binds_and_an_impossible_one_names_the_smallest_peak():
    model, inputs = mlp.make(batch=8, width=256, hidden=1024)
    options = dict(mesh="dp=4", hardware="h100-sxm", optimizer="sgd", recompute="none", offload=False)
    free = autopar.plan(model, inputs, **options)  # data parallel: every rank holds the weights
    cap = 0.5 * free.predicted.peak_memory_bytes
    capped = autopar.plan(model, inputs, **options, passes=[Constrain(lambda c: c.cap_memory(cap))])
    assert capped.predicted.peak_memory_bytes <= cap < free.predicted.peak_memory_bytes
    with pytest.raises(AutoparError, match="smallest peak autopar finds is"):
        autopar.plan(model, inputs, **options, passes=[Constrain(lambda c: c.cap_memory(1000))])


def test_a_pin_on_one_layer_stays_on_that_layer_under_clustering():
    model, inputs = gpt2.make(dataclasses.replace(gpt2.SIZES["small"], layers=5), device="meta")
    plan = autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm",
                        passes=[Constrain(lambda c: c.pin("blocks.2.fc.weight", "S(1)"))])
    assert str(plan.param_spec("blocks.2.fc.weight")) == "(S(1))"
    assert {str(plan.param_spec(f"blocks.{i}.fc.weight")) for i in (1, 3)} != {"(S(1))"}  # the others are free
    note = next(r.note for r in plan.history if r.name == "cluster_layers")
    assert note.startswith("2 of 5 layers")  # layer 2 left the cluster; layer 3 still shares layer 1's
    late = Constrain(lambda c: c.pin("blocks.2.fc.weight", "S(1)"), name="late", after="cluster_layers")
    with pytest.raises(AutoparError, match="came after cluster_layers"):
        autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm", passes=[late])


def test_a_custom_op_falls_back_until_it_has_a_rule_then_shards_and_trains():
    from autopar.ops.table import RULES
    from examples import custom_op

    model, inputs = custom_op.make()
    before = autopar.plan(model, inputs, mesh="tp=4", cache=False)
    assert set(before.fallback_ops) == {"autopar_examples.scaled_silu.default",
                                        "autopar_examples.scaled_silu_backward.default"}
    assert "autopar_examples.scaled_silu.default x1" in before.summary()  # reported, with where it sits
    custom_op.register_rules()
    try:
        after = autopar.plan(model, inputs, mesh="tp=4", cache=False)
        assert after.fallback_ops == ()
        assert str(after.param_spec("up.weight")) == "(S(0))"  # the MLP stays sharded through the op
        report = autopar.check(model, inputs, plan=after)
        assert report.ok, str(report)
    finally:
        for op in (torch.ops.autopar_examples.scaled_silu.default,
                   torch.ops.autopar_examples.scaled_silu_backward.default):
            RULES.pop(op, None)


class ReadsStrategies(autopar.Pass):
    """Reads the strategies table, declaring it or not."""

    name = "reads_strategies"

    def __init__(self, declared: bool):
        self.requires = ("strategies",) if declared else ()

    def run(self, program, ctx) -> str:
        return f"{len(program.table('strategies'))} nodes weighed"


def test_a_pass_reads_only_the_side_tables_it_declares():
    model, inputs = mlp.make(batch=8, width=64, hidden=128)
    with pytest.raises(AutoparError, match="read side table 'strategies' without declaring it"):
        autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, passes=[ReadsStrategies(declared=False)],
                     cache=False)
    plan = autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, passes=[ReadsStrategies(declared=True)],
                        cache=False)
    assert any(r.name == "reads_strategies" and r.note.endswith("nodes weighed") for r in plan.history)


def test_a_pass_that_writes_a_side_table_as_another_type_is_refused():
    class ListsStrategies(autopar.Pass):
        name = "lists_strategies"
        requires = provides = ("strategies",)

        def run(self, program, ctx) -> str:
            program.tables["strategies"] = list(program.table("strategies").items())
            return "rewrote"

    model, inputs = mlp.make(batch=8, width=64, hidden=128)
    with pytest.raises(AutoparError, match="wrote side table 'strategies' as a list; it holds node -> the Strategy"):
        autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, passes=[ListsStrategies()], cache=False)
