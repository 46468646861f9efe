"""What data parallelism adds to each optimizer step of a run on N GPUs: the all-reduce.

DDP averages the gradients of the trainable parameters once per optimizer step. For LoRA
these are the adapter's few MB to a few hundred MB (fp32), not the model's GBs, so the cost
is small next to a step's micro-batches: a ring all-reduce sends 2 (N-1)/N x the gradient
bytes through each GPU's link (NCCL's "bus bandwidth" is defined so that time = that volume /
bus bandwidth), plus a fixed cost per step (kernel launches, DDP's bucket bookkeeping, the
processes meeting). DDP overlaps the buckets with the backward pass; the model counts them
in full, which errs on the slow side by at most this term.

Each process also waits for the slowest of the N at every step: a micro-step's time varies
(lengths, noise), and the step ends when the last process is done. With the calibrated
relative sd of a micro-step, the expected maximum of N is mean + E[max of N standard
normals] x sd: `straggler_seconds`.

The link speeds are priors (bus bandwidth of large all-reduces as NCCL's own tests report
them on such links, rounded down); a lease of a multi-GPU node measures them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import BadInputError

GRADIENT_BYTES = 4  # PEFT keeps adapter weights, and so their gradients, in fp32


@dataclass(frozen=True)
class Link:
    """A link between the GPUs of one node, as an all-reduce sees it."""

    name: str
    bus_bytes_per_second: float
    step_seconds: float  # fixed cost of one optimizer step's all-reduce
    about: str


LINKS = {
    link.name: link
    for link in (
        Link("nvlink", 3.0e11, 2e-3, "NVLink 4 / NVSwitch (H100 SXM, H200): ~450 GB/s one way"),
        Link("nvlink3", 1.8e11, 2e-3, "NVLink 3 / NVSwitch (A100 SXM): ~300 GB/s one way"),
        Link("pcie5", 4.0e10, 3e-3, "PCIe 5.0 x16 through the host: ~64 GB/s one way"),
        Link("pcie4", 2.0e10, 3e-3, "PCIe 4.0 x16 through the host: ~32 GB/s one way"),
    )
}
DEFAULT_LINK = "nvlink"


def find_link(name: str) -> Link:
    """The link called `name` (one of `LINKS`)."""
    try:
        return LINKS[name]
    except KeyError:
        raise BadInputError(
            f"unknown interconnect {name!r}; known: {', '.join(LINKS)}"
        ) from None


def allreduce_seconds(trainable_parameters: int, gpus: int, link: Link) -> float:
    """One optimizer step's gradient all-reduce over `gpus` GPUs (0 on one)."""
    if gpus <= 1:
        return 0.0
    volume = 2.0 * (gpus - 1) / gpus * trainable_parameters * GRADIENT_BYTES
    return link.step_seconds + volume / link.bus_bytes_per_second


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (Blom's approximation, within 5 %).

    0 for one; 0.59 for two (exact: 1/sqrt(pi) = 0.564); 1.03 for four; 1.43 for eight.
    """
    if n <= 1:
        return 0.0
    from statistics import NormalDist

    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def straggler_seconds(
    micro_step_seconds: float, relative_sd: float, accumulation: int, gpus: int
) -> float:
    """How much longer a step takes on `gpus` GPUs because it waits for the slowest.

    Args:
        micro_step_seconds: Mean micro-step time.
        relative_sd: Relative sd of one micro-step (`Coefficients.step_noise_sd`).
        accumulation: Micro-steps per optimizer step on each GPU (their noise adds up).
        gpus: Processes that meet at the step's end.
    """
    sd = relative_sd * micro_step_seconds * math.sqrt(max(accumulation, 1))
    return expected_max_normal(gpus) * sd
