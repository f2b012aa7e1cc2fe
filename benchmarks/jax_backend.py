"""The JAX backend on the GPT-2-style decoder: compile time and step time of the emitted sharded
program on 8 CPU devices, beside a plain jax.jit of the same computation on one device (the
program autopar emits for a one-device mesh), measured in the same run.

    python benchmarks/jax_backend.py [--size small] [--mesh dp=2,tp=4] [--steps 10]

CPU devices share this machine's cores, so the sharded program is not expected to be faster
here; the figures show what sharding and its collectives cost on top of the same computation.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # before JAX loads
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

import autopar  # noqa: E402
from examples import gpt2  # noqa: E402
from tests.workers import FAST  # noqa: E402


def load(source: str, name: str):
    path = os.path.join(tempfile.mkdtemp(prefix="autopar-bench-"), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(module, params: dict, batch: list, steps: int) -> tuple[float, float, float]:
    """(compile seconds, median step seconds, loss)."""
    mesh = module.make_mesh()
    args = module.place(params, batch, mesh)
    start = time.perf_counter()
    compiled = module.train_step_fn(mesh).lower(*args).compile()
    compile_s = time.perf_counter() - start
    out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times), float(out[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(gpt2.SIZES))
    parser.add_argument("--mesh", default="dp=2,tp=4")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    model, inputs = gpt2.make(args.size)
    params = {k: v.numpy() for k, v in model.state_dict().items()}
    batch = [x.numpy() for x in inputs]
    print(f"GPT-2-style '{args.size}', batch {tuple(inputs[0].shape)}, {len(jax.devices())} CPU devices")
    rows = []
    for label, mesh in ((f"sharded ({args.mesh})", args.mesh), ("plain jit, 1 device", "dp=1")):
        start = time.perf_counter()
        plan = autopar.plan(model, inputs, mesh=mesh, hardware=FAST, cache=False)
        module = load(plan.emit("jax"), f"gen_{plan.hash}")
        plan_s = time.perf_counter() - start
        compile_s, step_s, loss = measure(module, params, batch, args.steps)
        rows.append((label, plan_s, compile_s, step_s, loss))
    print(f"  {'program':<24} {'plan+emit':>10} {'compile':>10} {'step':>10}  loss")
    for label, plan_s, compile_s, step_s, loss in rows:
        print(f"  {label:<24} {plan_s:>9.2f}s {compile_s:>9.2f}s {step_s * 1e3:>8.2f}ms  {loss:.6f}")
    print(f"sharded/plain step time: {rows[0][3] / rows[1][3]:.2f}x")


if __name__ == "__main__":
    main()
