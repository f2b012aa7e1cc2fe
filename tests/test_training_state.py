"""The training state as DTensors: parameters, gradients and optimizer state in the plan's
layouts, so torch's optimizers, clip_grad_norm_ and state dicts work as they do for FSDP2 and
tensor parallelism (gloo, against eager)."""
import copy
import io

import pytest
import torch

from autopar.check import compare
from autopar.runtime.local_cluster import get_cluster
from examples import gpt2, mlp
from tests import state_workers


def _run(job, model, *args, world=4):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return get_cluster(world).run(job, buffer.getvalue(), *args)


@pytest.mark.parametrize("optimizer,foreach,model_name", [
    ("adamw", True, "gpt2"), ("adamw", False, "mlp"), ("sgd", True, "mlp")])
def test_dtensor_parameters_train_with_torch_optimizers_and_global_clipping(optimizer, foreach, model_name):
    """Parameters and gradients are DTensors with the plan's placements; clip_grad_norm_ returns
    the global norm (a local norm would be smaller on a sharded model); three clipped steps of
    AdamW or SGD with momentum, foreach or not, give eager's losses and parameters."""
    if model_name == "gpt2":
        model, batch = gpt2.make("tiny")
    else:
        model, batch = mlp.make(batch=8, width=64, hidden=128)
    results = _run(state_workers.train_dtensor_state, model, batch, "dp=2,tp=2", optimizer, foreach)
    want = state_workers.train_clipped(copy.deepcopy(model), batch, optimizer, foreach)
    assert want["norms"][0] > 0.1  # the clip bites
    for got in results:
        assert got["dtensors"] and got["sharded"] > 0
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-4)
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
        for name, value in want["params"].items():  # the project's fp32 tolerance (autopar.check)
            assert compare(name, got["params"][name], value).ok, name


# Adam divides each update by the root of its squared gradients, so the summation-order noise of a
# small gradient (micro-batch means on a pipeline) moves its update by ~1e-4 of the parameter;
# an optimizer left on the old parameters, or without its weight-decay group, is off by >3e-3
ADAM_STEPS_TOLERANCE = (1e-3, 1e-6)


@pytest.mark.parametrize("mesh", ["dp=2,tp=2", "pp=2,dp=2"])
def test_an_optimizer_built_before_the_first_call_steps_the_sharded_parameters(mesh):
    """As training scripts do: the optimizer (AdamW, weight-decay groups from named_parameters(),
    a learning-rate scheduler) is built right after wrapping; sharding puts the new parameters
    in its groups, so three steps give eager's losses and parameters."""
    model, batch = gpt2.make("tiny")
    results = _run(state_workers.train_with_an_optimizer_built_first, model, batch, mesh, 3)
    want = state_workers.train_eager_with_groups(copy.deepcopy(model), batch, 3)
    for got in results:
        assert got["error"] is None, got["error"]
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-5) and got["lr"] == want["lr"]
        for name, value in got["params"].items():  # a pipeline rank: its stages' parameters
            assert compare(name, value, want["params"][name], ADAM_STEPS_TOLERANCE).ok, name
    assert set().union(*(got["params"] for got in results)) == set(want["params"])


def test_an_optimizer_that_stepped_before_sharding_is_refused_by_name():
    """Its state belongs to the old tensors: pairing it with the sharded ones would be wrong."""
    model, batch = mlp.make(batch=8, width=64, hidden=128)
    for got in _run(state_workers.train_with_an_optimizer_built_first, model, batch, "dp=2,tp=2", 1, True):
        assert "holds state for parameters that autopar has since replaced" in got["error"]
        assert "fc1.weight" in got["error"]


def test_a_pipelined_models_checkpoint_loads_into_a_single_process_model(tmp_path):
    """Each pipeline rank's state dict holds its stages' tensors alone (the others are dropped,
    not meta tensors), so torch.distributed.checkpoint saves the whole model from the stages
    together, and a single-process model loads it: the values the pipelined steps trained."""
    import torch.distributed.checkpoint as dcp

    model, batch = gpt2.make("tiny")
    directory = str(tmp_path / "pipelined")
    results = _run(state_workers.train_pipelined_and_save_model, model, batch, "pp=2,dp=2", 2, directory)
    eager = copy.deepcopy(model)
    state_workers._steps(eager, torch.optim.SGD(eager.parameters(), lr=0.1), batch, 2)
    assert set().union(*(r["keys"] for r in results)) == set(eager.state_dict())
    assert all(set(r["keys"]) < set(eager.state_dict()) for r in results)  # a stage's share, not the whole
    fresh = copy.deepcopy(model)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=directory)
    fresh.load_state_dict(state["model"])
    for name, value in fresh.named_parameters():
        assert compare(name, value, dict(eager.named_parameters())[name]).ok, name
        holders = [r["params"][name] for r in results if name in r["params"]]
        assert holders and all(torch.equal(value, held) for held in holders), name


def test_a_pipelined_run_resumes_from_its_checkpoint_on_its_mesh_and_on_another(tmp_path):
    """pp=2 x dp=2 saves the model and AdamW state after 2 of 4 steps (the optimizer state keyed
    by parameter name: the stages' param groups hold other parameters under one index); resumed
    on pp=2 x dp=2 the last 2 losses are bit-equal, resharded to dp=2 x tp=2 they continue."""
    model, batch = gpt2.make("tiny")
    directory = str(tmp_path / "step2")
    uninterrupted = _run(state_workers.train_and_checkpoint, model, batch, "pp=2,dp=2", 4, 2, directory, True)
    same = _run(state_workers.resume_from_checkpoint, model, batch, "pp=2,dp=2", 2, directory, True)
    other = _run(state_workers.resume_from_checkpoint, model, batch, "dp=2,tp=2", 2, directory, True)
    for whole_run, tail, resharded in zip(uninterrupted, same, other):
        assert tail == whole_run[2:]
        assert resharded == pytest.approx(whole_run[2:], rel=1e-5)


def test_a_run_killed_after_a_checkpoint_resumes_with_the_same_losses(tmp_path):
    """torch.distributed.checkpoint saves the DTensor model and AdamW state after 2 of 4 steps; a
    fresh model and optimizer (a restarted job) load it and run the last 2 steps: bit-equal
    losses."""
    model, batch = gpt2.make("tiny")
    directory = str(tmp_path / "step2")
    uninterrupted = _run(state_workers.train_and_checkpoint, model, batch, "dp=2,tp=2", 4, 2, directory)
    resumed = _run(state_workers.resume_from_checkpoint, model, batch, "dp=2,tp=2", 2, directory)
    for whole_run, tail in zip(uninterrupted, resumed):
        assert tail == whole_run[2:]


def test_a_checkpoint_loads_into_another_plan_and_into_a_single_process_model(tmp_path):
    """Saved under data parallelism on dp=4, the checkpoint loads into the solver's dp=2,tp=2
    layouts (torch's checkpoint reshards the DTensors) and into the eager model in one process;
    both continue as the uninterrupted run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, batch = gpt2.make("tiny")
    directory = str(tmp_path / "step2")
    uninterrupted = _run(state_workers.train_and_checkpoint, model, batch, "dp=4", 4, 2, directory)[0]
    resharded = _run(state_workers.resume_from_checkpoint, model, batch, "dp=2,tp=2", 2, directory)[0]
    assert resharded == pytest.approx(uninterrupted[2:], rel=1e-5)

    eager = copy.deepcopy(model)
    opt = state_workers.make_optimizer("adamw", eager.parameters(), foreach=True)
    model_state, optim_state = get_state_dict(eager, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory, no_dist=True)
    set_state_dict(eager, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert state_workers._steps(eager, opt, batch, 2) == pytest.approx(uninterrupted[2:], rel=1e-5)


@pytest.mark.slow  # a Hugging Face model end to end
def test_a_hugging_face_model_exports_a_checkpoint_from_pretrained_reads(tmp_path):
    """The full state dict (torch's get_model_state_dict with full_state_dict=True, on rank 0)
    handed to save_pretrained: LlamaForCausalLM.from_pretrained gives the trained model's logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                         max_position_embeddings=32, use_cache=False))
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    logits = _run(state_workers.train_and_export_pretrained, model, batch, "dp=2,tp=2", str(tmp_path))[0]
    loaded = LlamaForCausalLM.from_pretrained(str(tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, logits, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(model(**batch).logits, logits, atol=1e-3)  # trained away from the start


def test_each_data_parallel_block_passes_its_own_samples_with_inputs_local():
    """torchrun's convention: a DistributedSampler from autopar.data_parallel_info gives each
    data-parallel block of ranks (the two tp ranks of a dp rank share one) its own samples; the
    step is that of the batch they form together (the dp blocks in order), as eager trains it."""
    model, (idx, targets) = gpt2.make("tiny")
    g = torch.Generator().manual_seed(8)
    dataset = (torch.randint(0, 256, (16, 32), generator=g), torch.randint(0, 256, (16, 32), generator=g))
    results = _run(state_workers.train_on_local_batches, model, dataset, "dp=2,tp=2", 4)
    assert [r["data_parallel"] for r in results] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    losses = []
    for step in range(2):  # DistributedSampler deals sample i to block i % 2; each block reads 4 a step
        rows = [block + 2 * (4 * step + j) for block in range(2) for j in range(4)]
        loss = eager(dataset[0][rows], dataset[1][rows])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    for got in results:
        assert got["losses"] == pytest.approx(losses, rel=1e-5)
        for name, value in eager.named_parameters():
            assert compare(name, got["params"][name], value).ok, name


def test_a_pipelined_model_built_on_the_meta_device_takes_its_stages_blocks_of_rank0s_init():
    """On pp=2,dp=2 each rank allocates only its stage's blocks, which rank 0 fills from its
    one-module-at-a-time init: every parameter, on the ranks that hold it, equals the
    single-process init from the same seed bit for bit, and two steps train as eager."""
    model, batch = gpt2.make("tiny", seed=0)
    results = get_cluster(4).run(state_workers.materialize_on_meta, batch, "pp=2,dp=2")
    eager = copy.deepcopy(model)
    losses = state_workers._steps(eager, torch.optim.SGD(eager.parameters(), lr=0.1), batch, 2)
    held = set()
    for got in results:
        for name, value in got["params"].items():
            assert torch.equal(value, dict(model.named_parameters())[name]), name
        held |= set(got["params"])
        assert got["losses"] == pytest.approx(losses, rel=1e-5)
    assert held == {name for name, _ in model.named_parameters()}
    assert len(results[0]["params"]) < len(held)  # a stage's share


def test_a_model_built_on_the_meta_device_is_materialized_shard_by_shard():
    """Built on the meta device, GPT-2 tiny is initialized by rank 0 one module at a time (each
    module's reset_parameters, in model.modules() order) and each rank allocates only its blocks:
    the parameters equal a single-process init from the same seed, bit for bit, and train as it
    does. Under torch's MemTracker no rank peaks above a budget of 3/4 of the model (rank 0 holds
    its blocks plus one module whole); after it each holds its blocks alone."""
    model, batch = gpt2.make("tiny", seed=0)  # the single-process init (gpt2.make seeds 0)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    results = get_cluster(4).run(state_workers.materialize_on_meta, batch, "dp=2,tp=2")
    eager = copy.deepcopy(model)
    losses = state_workers._steps(eager, torch.optim.SGD(eager.parameters(), lr=0.1), batch, 2)
    for got in results:
        for name, value in model.named_parameters():
            assert torch.equal(got["params"][name], value), name
        assert got["losses"] == pytest.approx(losses, rel=1e-5)
    budget = 0.75 * full_bytes
    memory = get_cluster(4).run(state_workers.materialization_memory, batch, "dp=2,tp=2")
    for rank, got in enumerate(memory):
        assert got["peak"] <= budget < full_bytes, (rank, got["peak"], full_bytes)
        assert got["blocks"] < full_bytes / 1.9  # the plan shards nearly everything over tp=2


@pytest.mark.parametrize("mesh", ["dp=2,tp=2", "pp=2,dp=2"])
def test_a_full_state_dict_streams_from_rank0_into_an_uninitialized_meta_model(mesh):
    """init=None leaves the blocks empty; torch's set_model_state_dict with
    broadcast_from_rank0 fills them from rank 0's full state dict: eager's losses (on a
    pipeline, each rank takes its stage's entries)."""
    model, batch = gpt2.make("tiny", seed=3)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    results = get_cluster(4).run(state_workers.load_full_state_dict_streamed, buffer.getvalue(), batch, mesh)
    eager = copy.deepcopy(model)
    losses = state_workers._steps(eager, torch.optim.SGD(eager.parameters(), lr=0.1), batch, 2)
    for got in results:
        assert got == pytest.approx(losses, rel=1e-5)


@pytest.mark.parametrize("mesh", ["dp=2,tp=2", "pp=2,dp=2"])
def test_values_come_from_rank0_while_the_other_ranks_build_on_meta(mesh):
    """FSDP's sync_module_states pattern: rank 0 holds the weights (loaded, say), the others build
    the model on the meta device; each receives its blocks and trains as eager."""
    model, batch = gpt2.make("tiny", seed=4)
    results = _run(state_workers.real_on_rank0_meta_elsewhere, model, batch, mesh)
    eager = copy.deepcopy(model)
    losses = state_workers._steps(eager, torch.optim.SGD(eager.parameters(), lr=0.1), batch, 2)
    for got in results:
        assert got == pytest.approx(losses, rel=1e-5)


def test_uninitialized_meta_models_and_disagreeing_local_batches_are_refused_on_every_rank():
    """init=None cannot fill a non-persistent buffer (no state dict holds it); with inputs="local"
    ranks whose batches differ in shape would wait on each other, and tp peers that pass
    different samples would compute different steps: each is an error on every rank."""
    for message in get_cluster(2).run(state_workers.meta_model_left_uninitialized):
        assert message is not None and "non-persistent buffers scale" in message
    model, _ = gpt2.make("tiny")
    for message in _run(state_workers.local_batches_that_disagree, model, "ragged"):
        assert message is not None and "differ between ranks" in message
    for message in _run(state_workers.local_batches_that_disagree, model, "peers differ"):
        assert message is not None and "autopar.data_parallel_info" in message
