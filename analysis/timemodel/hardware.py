"""The machine a run executes on, and what the time model assumes of it before measuring.

`HardwareInfo` describes the device; `fingerprint` names a machine + model combination (a
calibration is for one); `prior_coefficients` are the time model's uncalibrated
coefficients, from the device's dense peak FLOP/s (a table of GPUs, or a matmul probe of
this CPU) and a utilisation prior.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analysis.timemodel.model import DEVICE_KINDS, Coefficients, ModelProfile
from analysis.timemodel.workload import PRECISION_BYTES
from common.checks import require

# Dense peak FLOP/s (half precision tensor cores, fp32 without TF32), from vendor data sheets.
# More specific names come first so that "A100" is not taken for "A10", "L40S" for "L4" and
# an H100 PCIe (lower clocks and power) for the SXM part.
_GPU_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 67e12),
    ("H100 PCIE", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A10G", 125e12, 31.2e12),
    ("4090", 165e12, 82.6e12),
    ("A6000", 154.8e12, 38.7e12),
    ("V100", 125e12, 15.7e12),  # fp16; bf16 is emulated on V100 and slower still
    ("T4", 65e12, 8.1e12),
)
_UNKNOWN_GPU_PEAK = (30e12, 10e12)  # conservative: an unknown GPU is assumed slow
_MPS_PEAK = (10e12, 5e12)
_GPU_UTILISATION = 0.35
_CPU_UTILISATION = 0.5  # of the measured matmul probe

# CUDA's caching allocator holds more than tensors do at the peak: 1.01-1.14 (median 1.05)
# in the 12 whole-row LoRA runs of Mistral-7B and Llama-3.1-8B on an H100 (2026-11-24,
# docs/measurements/gpu-scale-h100.json). The prior takes the largest; a study's trials
# measure their own (analysis.calibration.memory.reserved_ratio).
CUDA_RESERVED_OVER_ALLOCATED = 1.15


@dataclass(frozen=True)
class HardwareInfo:
    """The machine a run executes on.

    Attributes:
        device_kind: "cpu", "cuda" or "mps".
        device_name: GPU name (e.g. "NVIDIA H100 80GB HBM3") or CPU model string.
        memory_bytes: Device memory (host memory on CPU).
        cpu_cores: Logical CPU cores available to the run.
        precision: Training precision, "fp32", "bf16" or "fp16".
    """

    device_kind: str
    device_name: str
    memory_bytes: int
    cpu_cores: int
    precision: str = "fp32"

    def __post_init__(self) -> None:
        kind, precision = self.device_kind, self.precision
        require(kind in DEVICE_KINDS, f"device_kind must be one of {DEVICE_KINDS} but got {kind=}")
        require(
            precision in PRECISION_BYTES,
            f"precision must be one of {tuple(PRECISION_BYTES)} but got {precision=}",
        )

    @classmethod
    def this_cpu(cls, *, precision: str = "fp32") -> HardwareInfo:
        """Describe this machine's CPU from the standard library alone."""
        name = "cpu"
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            memory = 0
        return cls("cpu", name, int(memory), os.cpu_count() or 1, precision)



def fingerprint(hardware: HardwareInfo, model: ModelProfile) -> str:
    """Return a stable short hash naming a hardware + model combination.

    The hostname is left out on purpose: identical machines share a calibration. On CPU the
    core count is part of it because step time scales with the threads available.
    """
    key = {
        "device_kind": hardware.device_kind,
        "device_name": hardware.device_name.strip().lower(),
        "precision": hardware.precision,
        "cpu_cores": hardware.cpu_cores if hardware.device_kind == "cpu" else None,
        "total_parameters": model.total_parameters,
        "n_layers": model.n_layers,
        "hidden_size": model.hidden_size,
    }
    if model.active_parameters:  # only a mixture of experts: dense fingerprints stay as they were
        key["active_parameters"] = model.active_parameters
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def cpu_matmul_flops(seconds: float = 0.3, *, size: int = 512) -> float:
    """Measure this CPU's fp32 matmul FLOP/s with numpy for about `seconds`."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b  # warm-up: thread pool start and page faults
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * size**3 * count / elapsed


def peak_flops(
    hardware: HardwareInfo, *, cpu_probe: Callable[[], float] = cpu_matmul_flops
) -> float:
    """Dense peak FLOP/s of the device at the hardware's precision (CPU: measured probe)."""
    if hardware.device_kind == "cpu":
        return float(cpu_probe())
    half = hardware.precision != "fp32"
    if hardware.device_kind == "mps":
        return _MPS_PEAK[0] if half else _MPS_PEAK[1]
    known = gpu_peak_flops(hardware.device_name, half=half)
    if known is not None:
        return known
    return _UNKNOWN_GPU_PEAK[0] if half else _UNKNOWN_GPU_PEAK[1]


def gpu_peak_flops(device_name: str, *, half: bool = True) -> float | None:
    """A GPU's dense peak FLOP/s from its name (as CUDA reports it); None when not in the table.

    Args:
        device_name: E.g. "NVIDIA H100 80GB HBM3".
        half: bf16/fp16 tensor-core peak; False: fp32 without TF32.
    """
    name = device_name.upper()
    for key, half_peak, fp32_peak in _GPU_PEAKS:
        if re.search(rf"(?<![A-Z0-9]){key}(?![A-Z0-9])", name):
            return half_peak if half else fp32_peak
    return None


def prior_coefficients(
    hardware: HardwareInfo,
    *,
    cpu_probe: Callable[[], float] = cpu_matmul_flops,
    peak: float | None = None,
) -> Coefficients:
    """Uncalibrated coefficients from peak FLOP/s and a utilisation prior.

    Args:
        hardware: The machine.
        cpu_probe: Returns CPU FLOP/s; tests pass a constant to stay independent of timing.
        peak: The device's dense peak FLOP/s at the hardware's precision, for a GPU the
            table does not know; None: from the table (or the CPU probe).
    """
    on_cpu = hardware.device_kind == "cpu"
    if peak is None:
        peak = peak_flops(hardware, cpu_probe=cpu_probe)
    effective = peak * (_CPU_UTILISATION if on_cpu else _GPU_UTILISATION)
    # Attention matmuls run at lower efficiency (softmax, memory traffic): count them double.
    return Coefficients(
        micro_fixed_seconds=0.005 if on_cpu else 0.03,
        micro_seconds_per_flop=1.0 / effective,
        micro_seconds_per_adapter_flop=1.0 / effective,
        micro_seconds_per_attention_flop=2.0 / effective,
        optimizer_fixed_seconds=0.002 if on_cpu else 0.005,
        optimizer_seconds_per_parameter=3e-9 if on_cpu else 5e-11,
        eval_fixed_seconds=0.5,
        eval_seconds_per_flop=1.0 / effective,
        # A checkpoint holds adapter + AdamW state (~12 bytes/parameter) at ~200 MB/s.
        checkpoint_fixed_seconds=1.0,
        checkpoint_seconds_per_parameter=12 / 200e6,
        # Start-up: imports plus reading the base weights (~4 bytes/parameter at ~300 MB/s).
        startup_fixed_seconds=10.0,
        startup_seconds_per_parameter=4 / 300e6,
        data_seconds_per_token=1e-6,  # one tokenisation pass of a fast tokenizer
        memory_fixed_bytes=512 * 2**20 if on_cpu else 256 * 2**20,
        eval_seconds_per_batch=0.005 if on_cpu else 0.01,
        loop_seconds_per_micro_step=0.001 if on_cpu else 0.002,
        warmup_seconds=0.5 if on_cpu else 2.0,  # GPUs: CUDA context and kernel selection
        reserved_over_allocated=CUDA_RESERVED_OVER_ALLOCATED if hardware.device_kind == "cuda" else 1.0,
        source=f"prior:{hardware.device_kind}:{hardware.device_name}",
    )
