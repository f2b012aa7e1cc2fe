"""The emitted programs, pinned as text (tests/golden/): names, section comments, collectives
and layouts show up in review as a diff.

After an intended change to the emitted text (or to a plan), regenerate them and read the diff:

    AUTOPAR_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

import autopar
from autopar.ir.placement import Shard
from examples import gpt2, mlp

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("AUTOPAR_REGENERATE_GOLDEN") == "1"
# planned for an H100 at sizes where tensor parallelism pays, so the programs show what autopar
# does: column- and row-parallel weights on tp with their all-reduces, gradient syncs over dp.
# (On a single axis of two devices the solver keeps these weights whole: data parallelism is
# cheaper there, so a tp=2 golden would show no tensor parallelism.)
MODELS = {"mlp": lambda: mlp.make(batch=4096),
          "gpt2": lambda: gpt2.make(gpt2.GPT2Config(vocab=256, seq=64, layers=2, heads=32, width=2048, batch=8),
                                    device="meta")}
MESHES = {"dp2_tp2": "dp=2,tp=2"}
CASES = [("mlp", "dp2_tp2"), ("gpt2", "dp2_tp2")]
SUFFIX = {"torch": "py", "jax": "jax.py"}


@pytest.fixture(scope="module")
def plans():
    made = {}
    for model_name, mesh_name in CASES:
        model, inputs = MODELS[model_name]()
        made[model_name, mesh_name] = autopar.plan(model, inputs, mesh=MESHES[mesh_name], hardware="h100-sxm",
                                                   cache=False)
    return made


@pytest.mark.parametrize("backend", sorted(SUFFIX))
@pytest.mark.parametrize(("model_name", "mesh_name"), CASES)
def test_the_emitted_program_is_the_golden_text(plans, model_name, mesh_name, backend):
    path = GOLDEN / f"{model_name}_{mesh_name}.{SUFFIX[backend]}"
    text = plans[model_name, mesh_name].emit(backend)
    if REGENERATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    expected = path.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "emitted"))
    assert text == expected, f"the emitted program differs from {path} (regenerate: see this file's docstring):\n" \
                             f"{diff[:4000]}"


# a layer's partial sums reduced over tp in forward (a row-parallel weight's output: its values
# are named by their module, fc2_... or blocks_0_...) and a gradient reduced over dp in backward
TENSOR_PARALLEL = {"torch": r"rt\.(all_reduce|reduce_scatter)\((fc\d|blocks_\d+)_\w+, 'tp'",
                   "jax": r"lax\.psum(_scatter)?\((fc\d|blocks_\d+)_\w+, 'tp'"}
GRADIENT_SYNC = {"torch": r"rt\.start_(all_reduce|reduce_scatter)\(grad_\w+, 'dp'",
                 "jax": r"lax\.psum(_scatter)?\(grad_\w+, 'dp'"}


@pytest.mark.parametrize("backend", sorted(SUFFIX))
@pytest.mark.parametrize(("model_name", "mesh_name"), CASES)
def test_each_golden_program_reduces_a_tensor_parallel_matmul_and_syncs_gradients(model_name, mesh_name, backend):
    import re

    text = (GOLDEN / f"{model_name}_{mesh_name}.{SUFFIX[backend]}").read_text()
    forward, backward = text.split("# ---- forward ----")[1].split("# ---- backward ----")
    assert re.search(TENSOR_PARALLEL[backend], forward), "no tensor-parallel reduction in forward"
    assert re.search(GRADIENT_SYNC[backend], backward), "no gradient sync in backward"
    assert re.search(r"^#   \S+ +\[[\d, ]+\] +.*S\(\d\) on tp", text, re.MULTILINE), "no split weight in the header"


def test_programs_name_values_after_what_they_hold_and_mark_modules_and_phases(plans):
    source = plans["gpt2", "dp2_tp2"].emit("torch")
    for program in ("forward", "backward"):  # two programs, parameters by path, inputs by forward's names
        assert f"def {program}(\n    rt, wte_weight, wpe_weight, blocks_0_ln1_weight," in source
    assert " idx, targets,\n):" in source and " idx, targets, saved, grad_loss, sync, unsynced,\n):" in source
    assert "blocks_0_attn_q_weight" in source and "grad_blocks_0_attn_q_weight = " in source
    assert "# blocks.0.attn" in source and "# ---- forward ----" in source and "# ---- backward ----" in source
    assert "'blocks.0.attn.q.weight': grad_blocks_0_attn_q_weight" in source  # gradients returned by name
    assert "primals_" not in source
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        assert line.count("  # ") <= 1 and ("#" not in code), line  # one comment a line, after the code


def test_a_linear_layers_double_transpose_is_folded_at_capture():
    from autopar.capture import capture

    model, inputs = mlp.make()
    program = capture(model, inputs)
    transposes = [n for n in program.nodes() if str(n.target) == "aten.t.default"]
    assert transposes and all(str(n.args[0].target) != "aten.t.default" for n in transposes)


def test_a_recomputed_moved_value_keeps_its_recomputation_under_its_readable_name(plans):
    """A recomputed variable can be a moved value (an FSDP re-gather: ``<parameter>__<id>``); the
    printed plan must still recompute it, under the parameter's new name."""
    import dataclasses

    from autopar.lowering.naming import readable
    from autopar.lowering.schedule import moved_name

    plan = plans["mlp", "dp2_tp2"]
    moved = next(r for r in plan.redistributions if r.value in plan.graph.params)
    named = readable(dataclasses.replace(plan, recompute=(moved_name(moved.value, moved.id),)))
    fqn = plan.graph.params[moved.value]
    assert named.recompute == (moved_name(fqn.replace(".", "_"), moved.id),)


def test_values_named_like_the_programs_own_names_are_renamed_apart():
    """forward's arguments called ``saved`` and ``sync`` would collide with the backward program's."""
    import torch

    class Clashing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.accumulate = torch.nn.Linear(8, 8)

        def forward(self, saved, sync):
            return torch.nn.functional.mse_loss(self.accumulate(saved), sync)

    model, inputs = Clashing(), (torch.randn(4, 8), torch.randn(4, 8))
    source = autopar.plan(model, inputs, mesh="dp=2", hardware="h100-sxm", cache=False).emit("torch")
    compile(source, "<clashing>", "exec")  # no argument named twice
    assert "def forward(rt, accumulate_weight, accumulate_bias, saved_, sync_):" in source


def test_of_mirror_image_layouts_the_batch_lies_on_the_axis_named_dp(plans):
    """dp and tp are alike on one node, so each layout prices as its mirror image with the two
    axes swapped; the plan splits the batch over the axis the user named dp."""
    plan = plans["gpt2", "dp2_tp2"]
    dp, tp = plan.mesh.axis_names.index("dp"), plan.mesh.axis_names.index("tp")
    inputs = [plan.strategies[name].out_specs[0].placements for name in plan.graph.inputs]
    assert any(p[dp] == Shard(0) for p in inputs) and not any(p[tp] == Shard(0) for p in inputs), inputs
