"""The JAX backend: its coverage of PyTorch's Core ATen opset, and for the GPT-2-style decoder
and the Hugging Face zoo, compile time and step time of the emitted sharded program on 8 CPU
devices beside a plain jax.jit of the same computation on one device (the program autopar
emits for a one-device mesh), measured in the same run, rounds interleaved.

    python benchmarks/jax_backend.py [--models gpt2-style,gpt2,...] [--mesh dp=2,tp=4] [--steps 10]

CPU devices share this machine's cores, so the sharded program is not expected to be faster
here; the figures show what sharding and its collectives cost on top of the same computation.
Last line: ``core aten coverage: X/Y`` (Core ATen overloads the table translates / all).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # before JAX loads
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.backends.jax.aten import TABLE  # noqa: E402
from examples import gpt2, hf_zoo  # noqa: E402
from tests.workers import FAST  # noqa: E402

MODELS = ["gpt2-style", *hf_zoo.ZOO]


def core_aten_ops() -> list[str]:
    """Every overload PyTorch tags as Core ATen (torch.Tag.core)."""
    found = set()
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not hasattr(packet, "overloads"):
            continue
        for overload in packet.overloads():
            if torch.Tag.core in getattr(packet, overload).tags:
                found.add(f"aten.{name}.{overload}")
    return sorted(found)


def load(source: str, name: str):
    path = os.path.join(tempfile.mkdtemp(prefix="autopar-bench-"), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Program:
    """One emitted module, placed and compiled: its compile time and its steps."""

    def __init__(self, model, inputs, mesh: str):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a solve cut by its time limit is still a correct program
            plan = autopar.plan(model, inputs, mesh=mesh, hardware=FAST, cache=False, solver_time_limit_s=60)
        self.module = load(plan.emit("jax"), f"gen_{plan.hash}")
        self.plan_s = time.perf_counter() - start
        params = {k: v.detach().numpy() for k, v in [*model.named_parameters(), *model.named_buffers()]}
        jax_mesh = self.module.make_mesh()
        masks = self.module.draw_masks(jax.random.key(0))
        self.args = self.module.place(params, [x.numpy() for x in inputs], jax_mesh, masks)
        start = time.perf_counter()
        self.step = self.module.train_step_fn(jax_mesh).lower(*self.args).compile()
        self.compile_s = time.perf_counter() - start
        self.loss = float(jax.block_until_ready(self.step(*self.args))[0])
        self.times: list[float] = []

    def time_one_step(self) -> None:
        start = time.perf_counter()
        jax.block_until_ready(self.step(*self.args))
        self.times.append(time.perf_counter() - start)


def make(name: str):
    if name == "gpt2-style":
        return gpt2.make("small")
    return hf_zoo.make(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--mesh", default="dp=2,tp=4")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print(f"{len(jax.devices())} CPU devices; sharded on {args.mesh}; plain: jax.jit of the one-device program")
    print(f"  {'model':<11} {'compile sharded':>15} {'plain':>8} {'step sharded':>13} {'plain':>9} {'ratio':>6}  "
          f"loss sharded / plain")
    for name in args.models.split(","):
        model, inputs = make(name)
        sharded, plain = Program(model, inputs, args.mesh), Program(model, inputs, "dp=1")
        for _ in range(args.steps):  # interleaved: the machine's noise falls on both alike
            sharded.time_one_step()
            plain.time_one_step()
        step_s, plain_s = statistics.median(sharded.times), statistics.median(plain.times)
        print(f"  {name:<11} {sharded.compile_s:>14.2f}s {plain.compile_s:>7.2f}s {step_s * 1e3:>11.1f}ms "
              f"{plain_s * 1e3:>7.1f}ms {step_s / plain_s:>5.2f}x  {sharded.loss:.6f} / {plain.loss:.6f}", flush=True)
    core = core_aten_ops()
    missing = [op for op in core if op not in TABLE]
    print(f"table: {len(TABLE)} entries; Core ATen overloads without a translation ({len(missing)}):")
    print("  " + ", ".join(op.removeprefix("aten.") for op in missing))
    print(f"core aten coverage: {len(core) - len(missing)}/{len(core)}")


if __name__ == "__main__":
    main()
