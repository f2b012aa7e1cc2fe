"""Context parallelism: attention with its sequence split over a mesh axis (autopar.ops.attention,
autopar.runtime.context_parallel), checked against eager and against the rule's own op."""
import pytest
import torch

import autopar
from autopar.baseline_plans import SequenceSplit
from autopar.ir.placement import P, R, Shard
from autopar.ops.attention import SDPA_BACKWARD, SDPA_FORWARD, key_spec, keys_gathered, query_spec, sequence_axis
from autopar.ops.kinds import OpCall
from autopar.ops.validation import validate_rule
from examples.gpt2 import GPT2Config, make
from examples.hf_zoo import llama3_shaped
from tests.models import tiny_llama
from tests.op_samples import GENERATED
from tests.tiers import sampled
from tests.workers import FAST

ATTENTION = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
             "aten._scaled_dot_product_flash_attention_for_cpu_backward.default")


def keys_form(target, in_specs, axis: int) -> str:
    return "gathered" if keys_gathered(key_spec(target, in_specs), axis) else "whole"


def sequence_split_axes(plan) -> set:
    """The mesh axes the plan's attention calls split their sequence over."""
    axes = set()
    for node in plan.graph.nodes:
        if "scaled_dot_product" in node.target:
            axis = sequence_axis(query_spec(node.target, plan.strategies[node.name].in_specs))
            axes.add(None if axis is None else plan.mesh.axis_names[axis])
    return axes


def gpt2(batch: int):
    return make(GPT2Config(vocab=64, seq=32, layers=2, heads=2, width=32, batch=batch))


def llama(batch: int):
    model, kwargs = tiny_llama(heads=4, positions=64, sequence=32)
    return model, {k: v[:batch] for k, v in kwargs.items()}


MODELS = {"gpt2": gpt2, "llama": llama}


@pytest.mark.parametrize("target", ATTENTION)
def test_every_sequence_split_strategy_computes_attention(target):
    """The kernels on simulated ranks of a 2 x 2 mesh, causal or not, with a mask or not, against
    the op on the whole sequence; a kernel that drops the keys before a rank's block fails it."""
    rule = SDPA_FORWARD if "backward" not in target else SDPA_BACKWARD
    samples = [(c.args, c.kwargs) for c in GENERATED[target](torch.float64)]
    report = validate_rule(eval(f"torch.ops.{target}"), samples)
    assert report.ok, str(report)
    split = [c for c in GENERATED[target](torch.float64)
             if any(o.inputs[rule.query] == Shard(2) for o in rule.options(_call(target, c)))]
    assert len(split) >= 3, "samples of causal, plain and masked self-attention reach the sequence split"


def _call(target: str, c) -> OpCall:
    tensors = [a for a in c.args if isinstance(a, torch.Tensor)] + \
        [v for v in c.kwargs.values() if isinstance(v, torch.Tensor)]
    return OpCall(eval(f"torch.ops.{target}"), tuple(c.args), dict(c.kwargs), tuple(t.shape for t in tensors),
                  tuple(o.shape for o in c.out))


def test_the_sequence_splits_only_where_the_kernel_computes_the_call():
    q = (2, 3, 8, 4)
    plain = OpCall(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (None, None, None, 0.0, True),
                   {}, (q, q, q), (q, (2, 3, 8)))
    cross = OpCall(plain.target, plain.args, {}, (q, (2, 3, 6, 4), (2, 3, 6, 4)), (q, (2, 3, 8)))
    dropout = OpCall(plain.target, (None, None, None, 0.1, True), {}, (q, q, q), (q, (2, 3, 8)))
    mask = torch.zeros(8, 8)
    masked_causal = OpCall(plain.target, plain.args, {"attn_mask": mask}, (q, q, q, (8, 8)), (q, (2, 3, 8)))
    masked = OpCall(plain.target, (None, None, None, 0.0, False), {"attn_mask": mask}, (q, q, q, (8, 8)),
                    (q, (2, 3, 8)))

    def splits(call):
        return [o for o in SDPA_FORWARD.options(call) if o.inputs[0] == Shard(2)]

    assert [o.inputs[1] for o in splits(plain)] == [Shard(2), R]  # keys split as the queries, or whole
    assert [o.outputs for o in splits(plain)] == [(Shard(2), Shard(2))] * 2
    backward = OpCall(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                      (None,) * 6 + (0.0, True), {}, (q, q, q, q, q, (2, 3, 8)), (q, q, q))
    assert [o.outputs for o in SDPA_BACKWARD.options(backward) if o.inputs[1] == Shard(2)] == \
        [(Shard(2),) * 3, (Shard(2), P, P)]  # whole keys: every rank's queries add to their gradients
    assert not splits(cross) and not splits(dropout) and not splits(masked_causal)
    assert splits(masked)[0].inputs[3] == Shard(0)  # the mask's rows: the block's queries
    broadcast_rows = OpCall(plain.target, masked.args, {"attn_mask": torch.zeros(1, 8)}, (q, q, q, (1, 8)),
                            (q, (2, 3, 8)))
    assert splits(broadcast_rows)[0].inputs[3] == R


@pytest.mark.parametrize("name,mesh,precision,keys", sampled(
    [(name, mesh, precision, "gathered") for name in MODELS for mesh in ("cp=4", "dp=2,cp=2")
     for precision in (None, "bf16-mixed")]
    + [(name, mesh, precision, "whole") for name, mesh, precision in
       [("gpt2", "cp=4", None), ("llama", "cp=4", None), ("gpt2", "dp=2,cp=2", "bf16-mixed"),
        ("llama", "dp=2,cp=2", "bf16-mixed")]],
    inner_loop=[("gpt2", "cp=4", None, "gathered"), ("llama", "dp=2,cp=2", "bf16-mixed", "whole")]))
def test_sequence_split_training_equals_eager(name, mesh, precision, keys):
    """Three steps on gloo against eager (loss and every gradient): causal attention (GPT-2's
    flag, Llama's mask tensor with grouped-query heads and rotary positions) with the sequence
    split over cp, the keys and values gathered by the kernel or whole (gathered by the plan),
    the batch over dp where there is one."""
    model, inputs = MODELS[name](batch=2 if "dp" in mesh else 1)
    args, kwargs = (inputs, {}) if name == "gpt2" else ((), inputs)
    plan = autopar.plan(model, args, kwargs=kwargs, mesh=mesh, hardware=FAST, precision=precision,
                        passes=[SequenceSplit("cp", keys)])
    assert sequence_split_axes(plan) == {"cp"}
    cp = plan.mesh.axis_names.index("cp")
    assert {keys_form(n.target, plan.strategies[n.name].in_specs, cp) for n in plan.graph.nodes
            if "scaled_dot_product" in n.target} == {keys}
    report = autopar.check(model, args, kwargs=kwargs, plan=plan, steps=3)
    assert report.ok, str(report)


@pytest.mark.slow  # two pipelined runs
@pytest.mark.parametrize("name,keys", [("gpt2", "gathered"), ("llama", "whole")])
def test_sequence_split_inside_pipeline_stages_equals_eager(name, keys):
    """Two stages, each on a cp=2 mesh, two micro-batches of one sequence each."""
    model, inputs = MODELS[name](batch=2)
    args, kwargs = (inputs, {}) if name == "gpt2" else ((), inputs)
    plan = autopar.plan(model, args, kwargs=kwargs, mesh="pp=2,cp=2", hardware=FAST, microbatches=2,
                        passes=[SequenceSplit("cp", keys)])
    assert plan.pipeline is not None and "context parallel: 2 of 2" in plan.summary()
    report = autopar.check(model, args, kwargs=kwargs, plan=plan, steps=2)
    assert report.ok, str(report)


@pytest.mark.slow  # each rank compiles the programs
def test_a_compiled_sequence_split_program_equals_eager():
    model, inputs = gpt2(batch=1)
    plan = autopar.plan(model, inputs, mesh="cp=4", hardware=FAST, passes=[SequenceSplit("cp")])
    report = autopar.check(model, inputs, plan=plan, steps=2, compile=True)
    assert report.ok, str(report)


@pytest.mark.slow  # a step under torch's MemTracker on four ranks; the inner loop runs two sequence-split steps
def test_predicted_peak_of_a_sequence_split_matches_the_workers():
    """Activations dominate (512 tokens, width 32): the kernels' gathered keys and values and
    their gradients' sums are counted where they run. Within 10% of torch's MemTracker."""
    model, inputs = make(GPT2Config(vocab=64, seq=512, layers=2, heads=2, width=32, batch=1))
    plan = autopar.plan(model, inputs, mesh="cp=4", hardware=FAST, optimizer="sgd", passes=[SequenceSplit("cp")])
    report = autopar.check(model, inputs, plan=plan, measure_memory=True)
    assert report.ok, str(report)
    assert max(report.peak_memory_bytes) == pytest.approx(plan.predicted.peak_memory_bytes, rel=0.1), \
        plan.predicted.memory_bytes


def test_summary_and_explain_name_the_sequence_split():
    model, inputs = gpt2(batch=1)
    plan = autopar.plan(model, inputs, mesh="cp=4", hardware=FAST, passes=[SequenceSplit("cp", "gathered")])
    assert ("context parallel: 2 of 2 attention calls split their sequence over cp in contiguous blocks, 2 with "
            "their keys and values gathered inside the kernel") in plan.summary()
    explained = str(plan.explain("attention"))
    chosen = [line for line in explained.splitlines() if line.lstrip().startswith("->")]
    assert len(chosen) == 2 and all("all_gather[cp] inside" in line for line in chosen), explained
    assert ("sequence split: 2 of 2 calls split it over cp. Their layouts keeping it whole are ruled out by a "
            "constraint") in explained, explained
    code = plan.emit()
    assert code.count("context_parallel.attention_all_gather(rt, 'cp'") == 2
    assert code.count("context_parallel.attention_all_gather_backward(rt, 'cp'") == 2
    whole = autopar.plan(model, inputs, mesh="cp=4", hardware=FAST, passes=[SequenceSplit("cp", "whole")])
    assert "2 with their keys and values gathered by the plan's moves" in whole.summary()
    chosen = [line for line in str(whole.explain("attention")).splitlines() if line.lstrip().startswith("->")]
    assert len(chosen) == 2 and not any("inside" in line for line in chosen), chosen
    assert whole.emit().count("context_parallel.attention_of_block(rt, 'cp'") == 2


def test_explain_says_why_the_sequence_is_kept_whole():
    """Four sequences on four ranks: a sequence a rank, each whole. The plan fits its budget as it
    is, so the split's smaller activations would buy nothing, which explain says beside their
    prices; where the plan recomputes, it says that instead."""
    model, inputs = gpt2(batch=4)
    plan = autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm")
    assert sequence_split_axes(plan) == {None}
    note = str(plan.explain("attention")).splitlines()[-1]
    assert note.startswith("sequence split: kept whole. The layouts splitting it cost "), note
    assert "over these calls than the chosen ones" in note and "without recomputation or offload" in note, note
    recomputing = autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm", recompute="full")
    assert recomputing.recompute and sequence_split_axes(recomputing) == {None}
    note = str(recomputing.explain("attention")).splitlines()[-1]
    assert note.startswith("sequence split: kept whole.") and \
        f"by recomputing {len(recomputing.recompute)} forward values" in note, note


def test_the_jax_backend_refuses_the_sequence_split_by_name():
    model, inputs = gpt2(batch=1)
    plan = autopar.plan(model, inputs, mesh="cp=4", hardware=FAST, passes=[SequenceSplit("cp", "gathered")])
    with pytest.raises(autopar.AutoparError, match="does not emit context_parallel.attention_all_gather yet"):
        plan.emit("jax")


@pytest.mark.slow  # two plans of a Llama-8B-shaped model
def test_the_solver_splits_the_sequence_of_long_contexts_only():
    """On 8 H100s, one sequence of 131,072 tokens of a Llama-8B-shaped model (four of its layers,
    each with the 8B model's activations, keep the plans fast): the sequence split
    over the axis (without it the best plan found recomputes, offloads and takes over ten times
    as long: docs/context-parallel.md); a batch of eight sequences of 2,048 tokens: a sequence a
    device, each whole."""
    long = autopar.plan(*llama3_shaped("8b", batch=1, seq=131072, layers=4), mesh="dp=8", hardware="h100-sxm",
                        optimizer="adam-mixed", cache=False)
    assert sequence_split_axes(long) == {"dp"}, long.summary()
    assert "calls split it over dp" in str(long.explain("attention")).splitlines()[-1]
    assert long.predicted.peak_memory_bytes <= autopar.PRESETS["h100-sxm"].memory_bytes
    short = autopar.plan(*llama3_shaped("8b", batch=8, seq=2048, layers=4), mesh="dp=8", hardware="h100-sxm",
                         optimizer="adam-mixed", cache=False)
    assert sequence_split_axes(short) == {None}, short.summary()


def test_over_an_axis_of_one_rank_the_op_itself_runs():
    """Shard(2) over an axis of size 1 (a pipeline stage's mesh, say) is the whole sequence: no
    kernel, no module import, and nothing priced or held for one."""
    model, inputs = gpt2(batch=2)
    plan = autopar.plan(model, inputs, mesh="dp=2,cp=1", hardware=FAST, passes=[SequenceSplit("cp")])
    assert sequence_split_axes(plan) == {"cp"}
    code = plan.emit()
    assert "context_parallel." not in code and code.count("= kernels.attention_forward(") == 2
    assert "context parallel:" not in plan.summary()
    chosen = [line for line in str(plan.explain("attention")).splitlines() if line.lstrip().startswith("->")]
    assert len(chosen) == 2 and not any("[cp] inside" in line for line in chosen), chosen


@pytest.mark.slow  # three runs on four ranks
def test_a_sequence_split_run_resumes_from_its_checkpoint_on_its_mesh_and_on_another(tmp_path):
    """torch.distributed.checkpoint saves the model and AdamW state of autoparallelize's cp=4
    plan (which splits the sequence) after 2 of 4 steps; a fresh model on cp=4 runs the last 2
    bit-equal, and one on tp=4 (another plan: torch's checkpoint reshards) as the uninterrupted run."""
    from tests import state_workers

    model, batch = one_sequence_autoparallelize_splits()
    directory = str(tmp_path / "step2")
    whole = on_four_ranks(state_workers.train_and_checkpoint, model, batch, "cp=4", 4, 2, directory)
    same = on_four_ranks(state_workers.resume_from_checkpoint, model, batch, "cp=4", 2, directory)
    other = on_four_ranks(state_workers.resume_from_checkpoint, model, batch, "tp=4", 2, directory)
    for whole_run, tail, resharded in zip(whole, same, other):
        assert tail == whole_run[2:]
        assert resharded == pytest.approx(whole_run[2:], rel=1e-5)


@pytest.mark.slow  # three clipped AdamW steps on four ranks
def test_clipped_adamw_on_dtensor_state_with_the_sequence_split_equals_eager():
    """autoparallelize's own plan of one sequence on cp=4 splits it; torch's AdamW and
    clip_grad_norm_ on the DTensor parameters then give eager's losses, norms and parameters."""
    import copy

    from autopar.check import compare
    from tests import state_workers

    model, batch = one_sequence_autoparallelize_splits()
    results = on_four_ranks(state_workers.train_dtensor_state, model, batch, "cp=4", "adamw", True)
    want = state_workers.train_clipped(copy.deepcopy(model), batch, "adamw", True)
    for got in results:
        assert got["dtensors"]
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-4)
        for param, value in want["params"].items():
            assert compare(param, got["params"][param], value).ok, param


def one_sequence_autoparallelize_splits():
    """(GPT-2-style model, a batch of one sequence) whose autoparallelize plan on cp=4 (the
    solver's own, no layout pass) splits the sequence."""
    model, batch = gpt2(batch=1)
    assert sequence_split_axes(autopar.plan(model, batch, mesh="cp=4", hardware=FAST)) == {"cp"}
    return model, batch


def on_four_ranks(job, model, *args) -> list:
    """``job(rank, world, model_bytes, *args)`` on the four-rank worker pool: each rank's result."""
    import io

    from autopar.runtime.local_cluster import get_cluster

    buffer = io.BytesIO()
    torch.save(model, buffer)
    return get_cluster(4).run(job, buffer.getvalue(), *args)
