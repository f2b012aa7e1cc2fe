"""Ops that only one device implements, as data.

Capture runs on fake CPU tensors, so the graph can hold an op that only the CPU implements
(CPU flash attention). The code generator prints each of these as the function of
autopar.runtime.kernels named here, which runs the kernel of the device the tensors are on.
This torch build registers no CUDA kernels to ask the dispatcher about, hence a list.
"""
from __future__ import annotations

CPU_ONLY_OPS = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "attention_forward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": "attention_backward",
}
