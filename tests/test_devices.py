"""Programs for the device they are planned for: capture runs on fake CPU tensors, so an op that
only the CPU implements (CPU flash attention) is printed as a kernel that runs the device's own
(autopar.runtime.kernels). This torch build registers no CUDA kernels to ask, so the CPU-only
ops are an explicit list (autopar.ops.devices); the GPU check script (benchmarks/gpu_check.sh) runs the CUDA side."""
import inspect
import re

import torch
import torch.nn.functional as F

import autopar
from autopar.ops.devices import CPU_ONLY_OPS
from autopar.runtime import kernels
from examples import gpt2


def test_a_program_planned_for_a_gpu_calls_no_cpu_only_op_and_runs_attention_by_device():
    model, inputs = gpt2.make("tiny")
    source = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware="h100-sxm").emit("torch")
    called = set(re.findall(r"\b(aten\.[\w.]+)\(", source))
    assert called and not called & {op.removesuffix(".default") for op in CPU_ONLY_OPS}, called
    assert "for_cpu" not in source
    assert source.count("kernels.attention_forward(") == source.count("kernels.attention_backward(") == 2
    assert all(callable(getattr(kernels, name)) for name in CPU_ONLY_OPS.values())
    # on CUDA the kernels run the memory-efficient attention op, forward and backward
    assert "aten._scaled_dot_product_efficient_attention(" in inspect.getsource(kernels.attention_forward)
    assert "aten._scaled_dot_product_efficient_attention_backward(" in inspect.getsource(kernels.attention_backward)


def test_the_attention_kernels_equal_torch_attention_on_the_cpu():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g, requires_grad=True) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn(want.shape, generator=g)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    with torch.no_grad():
        out, logsumexp = kernels.attention_forward(q, k, v, 0.0, True)
        grads = kernels.attention_backward(grad, q, k, v, out, logsumexp, 0.0, True)
    torch.testing.assert_close(out, want)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected)
