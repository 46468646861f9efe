"""GPUs a plan can be made for before any of them is at hand: name, memory, precision.

The peak FLOP/s come from the time model's table (`analysis.timemodel.model.gpu_peak_flops`), looked
up by the name CUDA reports, so a plan uses the same priors a study on that GPU would start
from, and a calibration measured there (same device name) is found again.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from analysis.timemodel.hardware import HardwareInfo, gpu_peak_flops
from common.errors import BadInputError

GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model.

    Attributes:
        name: The short name `--gpu` takes (``H100``).
        device_name: The name CUDA reports (``torch.cuda.get_device_name``).
        memory_gib: Device memory as CUDA reports it (a little under the marketed GB).
        precision: The half precision it trains in (bf16 from Ampere on, else fp16).
        architecture: NVIDIA's generation (hopper, ampere, ada, turing, volta): a GPU with no
            fitted published run borrows the speed fitted on its generation's others.
    """

    name: str
    device_name: str
    memory_gib: float
    precision: str = "bf16"
    architecture: str = ""

    def hardware(self) -> HardwareInfo:
        """The time model's view of one such GPU (the CPU cores are this machine's)."""
        return HardwareInfo(
            "cuda",
            self.device_name,
            int(self.memory_gib * GIB),
            os.cpu_count() or 1,
            self.precision,
        )


KNOWN_GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("H200", "NVIDIA H200", 139.8, architecture="hopper"),
    GpuSpec("H100", "NVIDIA H100 80GB HBM3", 79.2, architecture="hopper"),
    GpuSpec("H100-PCIe", "NVIDIA H100 PCIe", 79.2, architecture="hopper"),
    GpuSpec("A100-80GB", "NVIDIA A100-SXM4-80GB", 79.2, architecture="ampere"),
    GpuSpec("A100-40GB", "NVIDIA A100-SXM4-40GB", 39.4, architecture="ampere"),
    GpuSpec("L40S", "NVIDIA L40S", 44.4, architecture="ada"),
    GpuSpec("L4", "NVIDIA L4", 22.0, architecture="ada"),
    GpuSpec("A10G", "NVIDIA A10G", 22.0, architecture="ampere"),
    GpuSpec("RTX4090", "NVIDIA GeForce RTX 4090", 23.6, architecture="ada"),
    GpuSpec("A6000", "NVIDIA RTX A6000", 47.5, architecture="ampere"),
    GpuSpec("V100", "Tesla V100-SXM2-32GB", 31.7, "fp16", architecture="volta"),
    GpuSpec("T4", "Tesla T4", 14.6, "fp16", architecture="turing"),
)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find_gpu(name: str) -> GpuSpec:
    """The known GPU `name` stands for (case, spaces and dashes do not matter).

    Raises:
        BadInputError: Not a known GPU; the message lists the known ones.
    """
    for gpu in KNOWN_GPUS:
        if _key(gpu.name) == _key(name):
            return gpu
    raise BadInputError(
        f"--gpu: unknown GPU {name!r}; known: {', '.join(g.name for g in KNOWN_GPUS)} "
        "(describe another one with --gpu-tflops and --gpu-memory-gb)"
    )


def custom_gpu(name: str, *, tflops: float, memory_gb: float, precision: str = "bf16") -> GpuSpec:
    """A GPU the table does not know, from its dense half-precision TFLOP/s and memory.

    Raises:
        BadInputError: A peak or a memory that is not > 0.
    """
    if not tflops > 0:
        raise BadInputError(f"--gpu-tflops must be > 0, but got {tflops!r}")
    if not memory_gb > 0:
        raise BadInputError(f"--gpu-memory-gb must be > 0, but got {memory_gb!r}")
    return GpuSpec(name, name, memory_gb * 1e9 / GIB, precision)


def peak_of(gpu: GpuSpec, tflops: float | None = None) -> float:
    """The GPU's dense peak FLOP/s at its precision: `tflops` when given, else the table's."""
    if tflops is not None:
        return tflops * 1e12
    peak = gpu_peak_flops(gpu.device_name, half=gpu.precision != "fp32")
    if peak is None:  # every KNOWN_GPUS entry is in the table; tests hold that
        raise BadInputError(f"no peak FLOP/s known for {gpu.device_name!r}: give --gpu-tflops")
    return peak
