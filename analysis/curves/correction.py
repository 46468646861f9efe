"""The accuracy correction of predicted final losses, fitted from full runs' measured losses.

Pure numpy: imports nothing from the project but the curve fit it corrects and its constants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analysis.curves.extrapolate import CurveFit, integer, number, rounded_dict
from analysis.curves.noise import MAD_TO_SD, Z90
from common.config import require_keys

CORRECTION_VERSION = 1
# Full runs' worth of "measured what it predicted" a correction is shrunk with, for a
# prediction whose loss shape the study identified (a curve went through a decay: the
# reference run, a full run). There each run's ratio is mostly its own configuration's error,
# about (within-study sd / between-study sd) ** 2 = 7.3 runs' worth of noise around the
# study's common bias, so one run must not move the correction far. Without the shape the
# bias is large and common: one run's worth stays best there (docs/notes/tuned-constants.md).
SHAPED_SHRINK_RUNS = 8


@dataclass(frozen=True)
class LossCorrection:
    """Accuracy calibration of predicted final losses, fitted from full runs.

    Extrapolating a trial's curve misses what happens late in the full run (the learning
    rate's decay lowers the loss; a longer run may start to overfit). Full runs report their
    measured final loss; the ratio measured / predicted p50 over those runs gives one
    multiplicative correction and its spread.

    Attributes:
        scale: Factor on predicted losses: the median ratio measured / predicted, shrunk
            toward 1 (see `fit_loss_correction`).
        log_sd: Robust sd of log(measured / predicted) over the runs (0 with fewer than 2).
        n_runs: Full runs the correction was fitted from.
        version: Format version of the stored correction.
    """

    scale: float = 1.0
    log_sd: float = 0.0
    n_runs: int = 0
    version: int = CORRECTION_VERSION

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive number but got {self.scale=}")
        if not (math.isfinite(self.log_sd) and self.log_sd >= 0):
            raise ValueError(f"log_sd must be a number >= 0 but got {self.log_sd=}")
        if self.n_runs < 0:
            raise ValueError(f"n_runs must be >= 0 but got {self.n_runs=}")
        if self.version != CORRECTION_VERSION:
            raise ValueError(f"version must be {CORRECTION_VERSION} but got {self.version=}")

    def apply(self, fit: CurveFit) -> CurveFit:
        """Return `fit` with its prediction corrected; method, reason and curve unchanged.

        p10/p50/p90 are multiplied by `scale`; each half of the band, in log space, gets
        1.28 x `log_sd` added in quadrature. `a`, `b`, `c` still describe the trial's
        observed losses (so `predict` matches them), not the corrected prediction. Apply a
        correction once: a corrected fit does not record that it was corrected.
        """
        p50 = self.scale * fit.p50
        extra = Z90 * self.log_sd
        p10 = (
            p50 * math.exp(-math.hypot(math.log(fit.p50 / fit.p10), extra)) if fit.p10 > 0 else 0.0
        )
        if fit.p50 > 0:
            p90 = p50 * math.exp(math.hypot(math.log(fit.p90 / fit.p50), extra))
        else:
            p90 = self.scale * fit.p90
        return replace(fit, p10=min(p10, p50), p50=p50, p90=max(p90, p50))

    def for_shape(self, identified: bool) -> LossCorrection:
        """The correction for a prediction whose loss shape the study identified (or not):
        the same runs' median ratio shrunk as if `SHAPED_SHRINK_RUNS` more runs, not one, had
        measured exactly their prediction (`fit_loss_correction`)."""
        n = self.n_runs
        if not identified or n == 0 or self.scale == 1.0:
            return self
        median = math.log(self.scale) * (n + 1) / n  # fit_loss_correction's shrink undone
        return replace(self, scale=math.exp(n / (n + SHAPED_SHRINK_RUNS) * median))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict; floats rounded to 6 significant digits."""
        return rounded_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> LossCorrection:
        """Build from `to_dict` output.

        Raises:
            ValueError: A field is unknown, missing or of the wrong type, or a value is bad.
        """
        require_keys(cls, data, cls.__name__, every=True)
        return cls(
            scale=number("scale", data["scale"]),
            log_sd=number("log_sd", data["log_sd"]),
            n_runs=integer("n_runs", data["n_runs"]),
            version=integer("version", data["version"]),
        )


def fit_loss_correction(pairs: Sequence[tuple[float, float]]) -> LossCorrection:
    """Fit the loss correction from full runs.

    Rule: with r_i = log(measured_i / predicted_i) over n runs,
    scale = exp(n / (n + 1) x median(r)): the median ratio, shrunk geometrically toward 1
    as if one more run had measured exactly its prediction. One run moves predictions
    half-way (in log space) to what it measured; ten runs 91 %. A prediction whose loss
    shape the study identified takes `LossCorrection.for_shape`: shrunk as if
    `SHAPED_SHRINK_RUNS` more runs had (one run moves it 11 %, eight half-way).
    log_sd = 1.4826 x median(|r - median(r)|) (0 with fewer than two runs).

    Args:
        pairs: (predicted p50, measured final loss) of each full run; both finite and > 0.

    Returns:
        The correction; the identity (scale 1, log_sd 0) when `pairs` is empty.

    Raises:
        ValueError: A pair is malformed or holds a non-positive or non-finite loss.
    """
    ratios = []
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise ValueError(f"pairs[{i}] must be (predicted, measured) but got {pair=}")
        predicted, measured = float(pair[0]), float(pair[1])
        if not all(math.isfinite(v) and v > 0 for v in (predicted, measured)):
            raise ValueError(f"pairs[{i}] must hold finite losses > 0 but got {pair=}")
        ratios.append(math.log(measured / predicted))
    n = len(ratios)
    if n == 0:
        return LossCorrection()
    log_ratios = np.asarray(ratios)
    centre = float(np.median(log_ratios))
    log_sd = float(MAD_TO_SD * np.median(np.abs(log_ratios - centre))) if n >= 2 else 0.0
    return LossCorrection(scale=math.exp(n / (n + 1) * centre), log_sd=log_sd, n_runs=n)
