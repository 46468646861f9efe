"""The learning-rate schedule of a run as transformers sets it, and its areas.

S1(s) is the forward area up to optimizer step s, S2(s) the annealing area (Tissue et al.,
"Scaling Law with Learning Rate Annealing", arXiv 2408.11029), both in units of the run's
peak rate: what `analysis.curves.law` fits the loss against. The paper's S1 sums the rate;
here each step adds its rate to the power `FORWARD_POWER` (see there).

Pure numpy: imports nothing from the project.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

# The momentum of the annealing area. The paper's 0.999 makes S2 grow with the run's length
# (about half its steps after a linear decay), so a C fitted on a short run through its own
# decay predicts a full run's decay 10x too large and its loss below zero; at 0.95 S2 saturates
# (about 20 units of drop per full drop, whatever the length). 0.95 predicted best and most
# steadily over the reference fractions (docs/notes/tuned-constants.md).
ANNEALING_DECAY = 0.95
# How much a step at a lower rate moves a run forward: S1 adds (rate / peak) ** FORWARD_POWER
# per step (1: the paper's area under the rate; 0: the step count). In these fine-tuning runs
# progress follows the steps more than the area: a run that decays to 0 gets about as far as
# one that stays near its peak rate for as many steps, though its area is half. 0.5 predicted
# better than 1 on the recorded runs and on rows held out from choosing it, with no coverage
# lost (docs/notes/tuned-constants.md).
FORWARD_POWER = 0.5
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """Warm-up steps as transformers' `TrainingArguments.get_warmup_steps` counts a ratio."""
    if not 0.0 <= warmup_ratio < 1.0:
        raise ValueError(f"warmup_ratio must be in [0, 1) but got {warmup_ratio=}")
    return math.ceil(total_steps * warmup_ratio)


def learning_rates(scheduler: str, total_steps: int, warmup: int, peak: float = 1.0) -> FloatArray:
    """The learning rate of each optimizer update 1..`total_steps`, as transformers sets it.

    transformers' `get_scheduler` multiplies the peak rate by lr_lambda(k) for update k + 1
    (the scheduler steps after each update), with these lr_lambda (warm-up w, total N):
    linear: k / w during warm-up, then (N - k) / (N - w); cosine: 0.5 (1 + cos(pi p)), p the
    share of the decay done; constant: 1; constant_with_warmup: k / w, then 1.

    Raises:
        ValueError: An unknown scheduler, or a step count that is not positive.
    """
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS} but got {scheduler=}")
    if total_steps < 1 or not 0 <= warmup <= total_steps:
        raise ValueError(
            f"need total_steps >= 1, 0 <= warmup <= total but got {total_steps=}, {warmup=}"
        )
    k = np.arange(total_steps, dtype=float)
    if scheduler == "constant":
        return np.full(total_steps, float(peak))
    warm = k / max(1, warmup)
    progress = (k - warmup) / max(1, total_steps - warmup)
    if scheduler == "linear":
        after = np.maximum(0.0, (total_steps - k) / max(1, total_steps - warmup))
    elif scheduler == "cosine":
        after = np.maximum(0.0, 0.5 * (1.0 + np.cos(math.pi * progress)))
    else:
        after = np.ones_like(k)
    return np.asarray(peak * np.where(k < warmup, warm, after), dtype=float)


def schedule_areas(
    rates: FloatArray, decay: float = ANNEALING_DECAY, power: float | None = None
) -> tuple[FloatArray, FloatArray]:
    """S1 and S2 after each update, in units of the peak rate (index k: after update k + 1).

    S1 adds (rate / peak) ** `power` per update (a step at the peak adds 1, a step at rate 0
    nothing); `power` None reads `FORWARD_POWER` when called (`benchmarks/rank_fidelity.py
    --forward-power` sets it to score recorded runs under another). The drops are counted
    from the first update on; a rising rate (warm-up) adds no annealing, as in the paper,
    where warm-up steps are left out of S2.
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1) but got {decay=}")
    if power is None:
        power = FORWARD_POWER
    if not 0.0 < power <= 1.0:
        raise ValueError(f"power must be in (0, 1] but got {power=}")
    peak = float(np.max(rates))
    if not (math.isfinite(peak) and peak > 0):
        raise ValueError(f"rates must hold a positive peak but got {peak=}")
    eta = np.asarray(rates, dtype=float) / peak
    drops = np.maximum(0.0, np.diff(eta, prepend=eta[0]) * -1.0)
    momentum = np.empty_like(eta)
    m = 0.0
    for i, drop in enumerate(drops):
        m = decay * m + drop
        momentum[i] = m
    return np.cumsum(eta**power), np.cumsum(momentum)
