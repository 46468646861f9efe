"""A trial's validation curve -> the predicted final validation loss of its full run.

The trial is the start of its full run, so its evaluations are the first points of the full
run's curve. They are fitted against training samples seen (within one run, tokens are
proportional to samples, and the power law's scale drops out) and extrapolated to the full
run's samples (`analysis.learning_curve.fit_curve`); the study's loss correction, fitted
from full runs that reported back, is then applied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.learning_curve import CurveFit, LossCorrection, fit_curve

CURVE_ATTR = "val_curve"  # [[samples_seen, val_loss], ...] of a trial
FIT_ATTR = "curve_fit"  # the uncorrected fit (CurveFit.to_dict)
PREDICTED_ATTR = "predicted_final_loss"  # {"p10", "p50", "p90"} after the correction


@dataclass(frozen=True)
class FinalLoss:
    """A trial's curve and what it predicts for the end of its full run.

    Attributes:
        points: (training samples seen, validation loss) of each evaluation.
        fit: The curve's fit and its prediction before the correction.
        predicted: The prediction the study uses: `fit` with the loss correction applied.
    """

    points: tuple[tuple[int, float], ...]
    fit: CurveFit
    predicted: CurveFit

    @property
    def last_loss(self) -> float:
        """The loss at the trial's own fidelity (the simple objective)."""
        return self.points[-1][1]

    def user_attrs(self) -> dict[str, Any]:
        """What the trial keeps in Optuna (the report and the export read these)."""
        return {
            CURVE_ATTR: [[s, round(loss, 6)] for s, loss in self.points],
            FIT_ATTR: self.fit.to_dict(),
            PREDICTED_ATTR: self.band(),
        }

    def band(self) -> dict[str, float]:
        """The corrected prediction, p10/p50/p90."""
        return loss_band(self.predicted)

    def metrics(self) -> dict[str, float]:
        """Final metrics of the trial's MLflow run."""
        fit = self.fit
        return {
            "predicted_final_loss_p10": self.predicted.p10,
            "predicted_final_loss_p50": self.predicted.p50,
            "predicted_final_loss_p90": self.predicted.p90,
            "predicted_final_loss_uncorrected": fit.p50,
            "loss_at_fidelity": self.last_loss,
            "curve_a": fit.a,
            "curve_b": fit.b,
            "curve_c": fit.c,
            "curve_points": float(fit.n_points),
        }

    def tags(self) -> dict[str, str]:
        """How the prediction was made (the fallback and why, when the fit was poor)."""
        tags = {"curve_method": self.fit.method}
        if self.fit.reason:
            tags["curve_reason"] = self.fit.reason
        return tags


def curve_points(eval_records: Sequence[Mapping[str, Any]]) -> tuple[tuple[int, float], ...]:
    """(samples seen, loss) of each evaluation; one point per amount of data (the last)."""
    by_samples: dict[int, float] = {}
    for record in eval_records:
        samples = int(record.get("samples_seen", 0))
        if samples > 0:
            by_samples[samples] = float(record["loss"])
    return tuple(sorted(by_samples.items()))


def predict_final_loss(
    eval_records: Sequence[Mapping[str, Any]],
    *,
    full_run_samples: float,
    correction: LossCorrection,
    seed: int = 0,
) -> FinalLoss | None:
    """Extrapolate a trial's evaluations to the end of its full run.

    Args:
        eval_records: The run's `TrainResult.eval_records` (step, loss, samples_seen, ...).
        full_run_samples: Training samples the full run sees (samples x epochs).
        correction: The study's fitted correction (the identity before any full run).
        seed: The bootstrap's seed (a trial's number: the same trial, the same band).

    Returns:
        The prediction; None when the run made no evaluation with a finite loss (the trial
        fails with that reason instead).
    """
    points = curve_points(eval_records)
    if not points or not all(math.isfinite(loss) for _, loss in points):
        return None
    target = max(float(full_run_samples), float(points[-1][0]))
    fit = fit_curve([s for s, _ in points], [loss for _, loss in points], target, seed=seed)
    return FinalLoss(points=points, fit=fit, predicted=correction.apply(fit))


def loss_band(fit: CurveFit) -> dict[str, float]:
    """A prediction's p10/p50/p90, as the estimate and the preset carry it."""
    return {"p10": _sig6(fit.p10), "p50": _sig6(fit.p50), "p90": _sig6(fit.p90)}


def correction_summary(correction: LossCorrection) -> dict[str, Any]:
    """The correction an estimate was made with: its factor and how many full runs it rests on."""
    return {"scale": _sig6(correction.scale), "runs": correction.n_runs}


def _sig6(value: float) -> float:
    return float(f"{value:.6g}")
