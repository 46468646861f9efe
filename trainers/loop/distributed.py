"""One run on several processes (one per GPU): who this process is, and what they agree on.

`torchrun` (or `accelerate launch`, or `trainers.train --gpus N`, which starts torchrun) sets
RANK, WORLD_SIZE and LOCAL_RANK; transformers' Trainer then opens the process group (NCCL on
CUDA, gloo on CPU) and trains data-parallel: each process takes its share of every optimizer
step's micro-batches and DDP averages the adapter's gradients. What the Trainer leaves to us
is what our own loop decides per process: the step's loss, tokens and samples are summed over
the processes, and a stop (window, signal, early stop) or a save decided on any process is
taken by all at the same step; otherwise one process would wait forever in the next
all-reduce. Process 0 alone writes checkpoints, MLflow records and the summary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# How a stop is ranked when processes disagree (the highest wins): a signal or the window
# makes the run resumable, which must not be hidden behind another process's plain stop.
STOP_PRIORITY = ("", "stopped", "stopped_early", "stopped_by_window", "stopped_by_signal")


@dataclass(frozen=True)
class Processes:
    """This process's place among the processes training one run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The process that writes checkpoints, MLflow records and the summary."""
        return self.rank == 0

    @property
    def several(self) -> bool:
        return self.world_size > 1


def processes(environ: dict[str, str] | None = None) -> Processes:
    """This process's rank and the run's process count, from the launcher's variables."""
    env = os.environ if environ is None else environ
    return Processes(
        rank=int(env.get("RANK", "0")),
        world_size=int(env.get("WORLD_SIZE", "1")),
        local_rank=int(env.get("LOCAL_RANK", "0")),
    )


def _joined() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _device() -> torch.device:
    """Where collectives' tensors live: the process's GPU for NCCL, the CPU for gloo."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def summed(values: Sequence[float]) -> list[float]:
    """`values` summed over the processes (as they are with one process)."""
    if not _joined():
        return [float(v) for v in values]
    import torch.distributed as dist

    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.cpu().tolist()]


def highest(values: Sequence[int]) -> list[int]:
    """`values` maximised over the processes (as they are with one process)."""
    if not _joined():
        return [int(v) for v in values]
    import torch.distributed as dist

    tensor = torch.tensor([int(v) for v in values], dtype=torch.int64, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.cpu().tolist()]


def from_main(value: Any) -> Any:
    """Process 0's `value`, on every process (picklable values)."""
    if not _joined():
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def wait_for_all() -> None:
    """Return when every process got here (no-op with one process)."""
    if _joined():
        import torch.distributed as dist

        dist.barrier()


def join(device: str) -> None:
    """Open the process group now (the Trainer would later): NCCL for GPUs, gloo on the CPU.

    The processes must agree before the Trainer exists: process 0 tokenizes the data into the
    cache before the others read it.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    gpu = device != "cpu" and torch.cuda.is_available()
    if gpu:
        # "cuda" then means this process's GPU, wherever the model is put.
        torch.cuda.set_device(processes().local_rank)
    dist.init_process_group(backend="nccl" if gpu else "gloo")
