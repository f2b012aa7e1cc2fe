"""Run a plan's JAX program on N CPU devices in a fresh interpreter and read back its loss and
gradients (autopar.check with backend="jax").

A fresh interpreter because XLA fixes the number of host devices when JAX first loads, and
because it is exactly how a user runs the emitted file: ``python gen.py --params ... --batch ...``.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from torch import nn

from autopar.backends.jax.codegen import dropout_masks
from autopar.errors import AutoparError
from autopar.runtime.rank_mesh import global_dropout_mask


def run_jax_step(plan, model: nn.Module, inputs: tuple, seed: int, timeout_s: float = 600) -> tuple[float, dict, str]:
    """(loss, {parameter name: gradient as a torch tensor}, what the program printed); its dropout
    masks are those the single-process model draws after ``torch.manual_seed(seed)``."""
    with tempfile.TemporaryDirectory(prefix="autopar-jax-") as tmp:
        source = os.path.join(tmp, "gen.py")
        with open(source, "w") as f:
            f.write(plan.emit("jax"))
        state = {k: v.detach().cpu().numpy()  # every buffer, non-persistent ones too (not in state_dict)
                 for k, v in [*model.named_parameters(), *model.named_buffers()]}
        np.savez(os.path.join(tmp, "params.npz"), **state)
        np.savez(os.path.join(tmp, "batch.npz"), **{f"x{i}": x.detach().cpu().numpy() for i, x in enumerate(inputs)})
        np.savez(os.path.join(tmp, "masks.npz"), **torch_dropout_masks(plan, seed))
        env = dict(os.environ, XLA_FLAGS=_with_devices(os.environ.get("XLA_FLAGS", ""), math.prod(plan.mesh.shape)),
                   JAX_PLATFORMS="cpu")
        done = subprocess.run([sys.executable, source, "--params", os.path.join(tmp, "params.npz"), "--batch",
                               os.path.join(tmp, "batch.npz"), "--grads", os.path.join(tmp, "grads.npz"),
                               "--masks", os.path.join(tmp, "masks.npz")],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
        if done.returncode != 0:
            raise AutoparError(f"the emitted JAX program failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        saved = np.load(os.path.join(tmp, "grads.npz"))
        grads = {k: torch.from_numpy(np.array(saved[k])) for k in saved.files if k != "__loss__"}
        return float(saved["__loss__"]), grads, done.stdout


def _with_devices(flags: str, devices: int) -> str:
    """The caller's XLA flags, with as many host devices as the mesh has."""
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={devices}"])


def torch_dropout_masks(plan, seed: int) -> dict:
    """The masks torch's dropout draws, in the program's order, for the whole tensors: the model
    run single-process after ``torch.manual_seed(seed)`` draws the same (as the torch program's
    ranks do, autopar.runtime.rank_mesh)."""
    torch.manual_seed(seed)
    return {name: global_dropout_mask(shape, getattr(torch, dtype), p).numpy()
            for name, (shape, p, dtype) in dropout_masks(plan).items()}
