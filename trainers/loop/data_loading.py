"""How the training data loader feeds the device: worker processes and pinned memory.

A pure function of what was detected (device kind, CPU cores), so every branch is tested on
any machine. The samples are tokenized once and held in memory; a micro-batch only needs
padding, which costs far less than a step. Worker processes pay off when the main process
must keep a GPU busy; on a CPU-only machine they compete with the training for the same
cores (on the 2-core development VM, 2 workers made tiny-model steps slower than none).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Enough to hide padding and host-to-device copies behind a GPU step; more only adds
# processes and memory.
MAX_GPU_WORKERS = 4


@dataclass(frozen=True)
class DataLoading:
    """The data loader's settings and why they were chosen."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    reason: str

    def training_arguments(self) -> dict[str, Any]:
        """The matching `TrainingArguments` keywords."""
        return {
            "dataloader_num_workers": self.num_workers,
            "dataloader_pin_memory": self.pin_memory,
            "dataloader_persistent_workers": self.persistent_workers,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_data_loading(device: str, cpu_count: int | None, requested: int | None) -> DataLoading:
    """Workers and pinned memory for `device` on a machine with `cpu_count` cores.

    Args:
        device: The training device (`cpu`, `cuda`, `mps`).
        cpu_count: CPU cores available to this process (None: unknown, taken as 1).
        requested: Workers the user asked for (None: choose).
    """
    cores = max(1, cpu_count or 1)
    pin = device == "cuda"  # page-locked host memory speeds up copies to a CUDA device only
    if requested is not None:
        workers, reason = requested, f"{requested} worker(s) on {device} as requested"
    elif device == "cuda":
        workers = min(MAX_GPU_WORKERS, max(0, cores // 2 - 1) if cores > 2 else 0)
        reason = f"{workers} worker(s) for {device} on {cores} cores (half, one kept back)"
    else:
        workers = 0
        reason = f"no workers on {device}: the training itself uses the {cores} core(s)"
    persistent = workers > 0  # no re-spawn at every epoch and evaluation
    return DataLoading(workers, pin, persistent, f"{reason}; pin_memory={pin}")


def available_cpus() -> int | None:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
