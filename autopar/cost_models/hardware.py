"""Hardware specs (autopar.ir.hardware): presets from DESIGN.md's table, "cpu" (this machine as
calibrated), or a JSON/YAML file."""
from __future__ import annotations

import dataclasses
import json
import os

from autopar.errors import AutoparError
from autopar.ir.hardware import GB, Hardware, Link

__all__ = ["GB", "Hardware", "Link", "PRESETS", "get_hardware", "load_hardware", "save_hardware",
           "calibrated_cpu_path"]



# GPUs run NCCL on their own streams beside compute; the last gradients of backward have
# nothing left to hide under and the two contend for SMs and memory, so not all of backward
# covers (0.8: an assumption, not a measurement).
_GPU_OVERLAP = 0.8
# Host links: PCIe Gen4 x16 (A100) moves about 25 GB/s per direction of its 32 GB/s, Gen5 x16
# (H100, H200) about 50 of 64. Host memory per node: DGX A100 1 TB, DGX H100/H200 2 TB. The host
# optimizer rate (Adam, parameter elements per second per node) is of the order ZeRO-Offload's
# vectorized CPU-Adam reaches on a two-socket server (Ren et al. 2021): an assumption, not a
# measurement; `autopar calibrate` measures this machine's.
_PCIE4, _PCIE5 = Link(25 * GB, 1e-5), Link(50 * GB, 1e-5)
_CPU_ADAM_RATE = 1e9
PRESETS = {
    "a100-sxm-80g": Hardware("a100-sxm-80g", 312e12, 80 * GB, 2.04e12, Link(300 * GB, 1e-6), Link(25 * GB, 2e-6),
                             gradient_overlap=_GPU_OVERLAP, host_link=_PCIE4, host_memory_bytes=1e12,
                             host_optimizer_rate=_CPU_ADAM_RATE),
    "h100-sxm": Hardware("h100-sxm", 989e12, 80 * GB, 3.35e12, Link(450 * GB, 1e-6), Link(50 * GB, 2e-6),
                         gradient_overlap=_GPU_OVERLAP, host_link=_PCIE5, host_memory_bytes=2e12,
                         host_optimizer_rate=_CPU_ADAM_RATE),
    "h200-sxm": Hardware("h200-sxm", 989e12, 141 * GB, 4.8e12, Link(450 * GB, 1e-6), Link(50 * GB, 2e-6),
                         gradient_overlap=_GPU_OVERLAP, host_link=_PCIE5, host_memory_bytes=2e12,
                         host_optimizer_rate=_CPU_ADAM_RATE),
}


def calibrated_cpu_path() -> str:
    """Where ``autopar calibrate`` keeps this machine's spec unless told otherwise."""
    root = os.environ.get("AUTOPAR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "autopar")
    return os.path.join(root, "cpu.json")


def get_hardware(hardware: str | Hardware) -> Hardware:
    """A preset name, "cpu" (this machine, once calibrated), a .json/.yaml spec path, or a Hardware value."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware in PRESETS:
        return PRESETS[hardware]
    if hardware == "cpu":
        path = calibrated_cpu_path()
        if not os.path.exists(path):
            raise AutoparError(f"hardware 'cpu' is this machine as measured by `autopar calibrate`, which "
                               f"has not run yet (no {path}); run it once (about a minute)")
        return dataclasses.replace(load_hardware(path), collectives_library="gloo")
    if isinstance(hardware, (str, os.PathLike)) and str(hardware).endswith((".json", ".yaml", ".yml")):
        return load_hardware(hardware)
    raise AutoparError(f"unknown hardware {hardware!r}; choose one of {', '.join(sorted(PRESETS))}, cpu "
                       f"or give a .json/.yaml spec file (`autopar calibrate --out FILE` writes one)")


def load_hardware(path: str | os.PathLike) -> Hardware:
    path = str(path)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise AutoparError(f"cannot read the hardware spec {path}: {exc.strerror}") from exc
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise AutoparError(f"the hardware spec {path} is not valid JSON: {exc}") from exc
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AutoparError(f"the hardware spec {path} is not valid YAML: {exc}") from exc
    return Hardware.from_dict(data, source=f"the hardware spec {path}")


def save_hardware(hw: Hardware, path: str | os.PathLike) -> None:
    with open(path, "w") as f:
        f.write(hw.to_json() + "\n")
