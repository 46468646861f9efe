"""What the estimator says of a configuration, as the study records it.

`verdict_of` judges a full run's prediction against the window and the memory limit (the
`Verdict` Optuna's constraints and a never-trained trial's metrics come from);
`describe_estimate` writes the preset's `estimate` (duration with its band, cost, throughput,
budget, hardware); `honesty_metrics` compare the prediction of a trial's own run with what
it measured. `hpo.estimator.StudyEstimator` makes the predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.timemodel.model import BAND_PARTS, Coefficients, Estimate
from common.fmt import format_duration

if TYPE_CHECKING:
    from analysis.calibration.file import Calibration
    from analysis.timemodel.hardware import HardwareInfo
    from hpo.config import Budget

GIB = 2**30


@dataclass(frozen=True)
class Verdict:
    """What the time model said about one configuration before it trained.

    Attributes:
        feasible: The predicted p90 duration fits the window and the peak memory the limit.
        reason: Why not, in one line (empty when feasible).
        full_run: Prediction of the full run the configuration would become.
        trial_run: Prediction of the trial's own short run, made before it ran.
        constraints: Optuna constraint values (feasible when every one is <= 0).
        coefficients: The coefficients both predictions used.
    """

    feasible: bool
    reason: str
    full_run: Estimate
    trial_run: Estimate
    constraints: dict[str, float]
    coefficients: Coefficients

    def metrics(self) -> dict[str, float]:
        """Final MLflow metrics of a trial that was never trained."""
        return {
            "predicted_full_run_hours_p50": self.full_run.seconds_p50 / 3600,
            "predicted_full_run_hours_p90": self.full_run.seconds_p90 / 3600,
            "predicted_peak_memory_gb": self.full_run.peak_memory_bytes / GIB,
            "predicted_peak_memory_gb_p90": self.full_run.peak_memory_bytes_p90 / GIB,
            **{f"constraint_{name}": value for name, value in self.constraints.items()},
        }


def verdict_of(
    full: Estimate,
    own: Estimate,
    coefficients: Coefficients,
    *,
    available_seconds: float,
    memory_limit_bytes: float,
) -> Verdict:
    """Does the full run `full` fit the window and the memory limit? (`own`: its trial's run.)"""
    constraints = {
        # Relative overshoot: unit-free, so TPE can add the two when it ranks violations.
        "duration": full.seconds_p90 / available_seconds - 1.0,
        # The p90 (on CUDA what the allocator reserves): an under-predicted peak is an
        # out-of-memory crash hours in.
        "memory": full.memory_bound_bytes / memory_limit_bytes - 1.0,
    }
    reasons = []
    if constraints["duration"] > 0:
        reasons.append(
            f"predicted {format_duration(full.seconds_p50)} "
            f"(p90 {format_duration(full.seconds_p90)}) "
            f"> {format_duration(available_seconds)} available"
        )
    if constraints["memory"] > 0:
        reserved = ""
        if full.peak_reserved_bytes_p90 > full.peak_memory_bytes_p90:
            reserved = f", {full.peak_reserved_bytes_p90 / GIB:.1f} GB reserved by the allocator"
        reasons.append(
            f"predicted peak memory {full.peak_memory_bytes / GIB:.1f} GB "
            f"(p90 {full.peak_memory_bytes_p90 / GIB:.1f} GB{reserved}) "
            f"> {memory_limit_bytes / GIB:.1f} GB limit"
        )
    return Verdict(not reasons, "; ".join(reasons), full, own, constraints, coefficients)


def describe_estimate(
    estimate: Estimate,
    *,
    budget: Budget,
    memory_limit_bytes: float,
    hardware: HardwareInfo,
    fingerprint: str,
    calibration: Calibration | None,
) -> dict[str, Any]:
    """The preset's `estimate`: duration with interval, cost, throughput, budget, hardware."""
    available = budget.available_seconds
    fits = estimate.seconds_p90 <= available and estimate.memory_bound_bytes <= memory_limit_bytes
    return rounded(
        {
            "method": "time model: start-up + steps x (accumulation x micro-step + optimizer "
            "step) + evaluations + checkpoints",
            "duration_hours": {
                "p10": estimate.seconds_p10 / 3600,
                "p50": estimate.seconds_p50 / 3600,
                "p90": estimate.seconds_p90 / 3600,
            },
            "breakdown_hours": {k: v / 3600 for k, v in estimate.breakdown.items()},
            "cost": estimate.cost(budget.price_per_hour),
            "price_per_hour": budget.price_per_hour,
            "tokens_per_second": estimate.tokens_per_second,
            "optimizer_steps": estimate.optimizer_steps,
            # Data-parallel on this many GPUs: the hours are wall-clock, the memory per GPU,
            # the cost all of them (gpus x price x hours).
            "gpus": estimate.gpus,
            "gpu_hours_p50": estimate.gpus * estimate.seconds_p50 / 3600,
            "peak_memory_gb": estimate.peak_memory_bytes / GIB,
            "peak_memory_gb_p90": estimate.peak_memory_bytes_p90 / GIB,
            # CUDA: what the caching allocator holds at that peak (nvidia-smi's number).
            "peak_memory_reserved_gb_p90": estimate.memory_bound_bytes / GIB,
            "memory_limit_gb": memory_limit_bytes / GIB,
            "fits_window": fits,
            "window_hours": budget.window_hours,
            "safety_margin_minutes": budget.safety_margin_minutes,
            "available_hours": available / 3600,
            "hardware": _hardware_section(hardware),
            "hardware_fingerprint": fingerprint,
            "calibration_id": calibration.calibration_id if calibration else None,
            "calibration_runs": calibration.n_measurements.get("runs", 0) if calibration else 0,
            "source": estimate.source,
            "band_pct": band_pct(estimate),
        }
    )


def band_pct(estimate: Estimate) -> dict[str, float]:
    """The duration band's parts as % above the median at p90: which one makes it wide."""
    return {
        part: 100.0 * math.expm1(estimate.extra.get(f"band_{part}_log_p90", 0.0))
        for part in BAND_PARTS
    }


def honesty_metrics(own: Estimate, full: Estimate, measured: float) -> dict[str, float]:
    """How the prediction of the trial's own run compares with its measured duration."""
    return {
        "predicted_trial_seconds": own.seconds_p50,
        "predicted_trial_seconds_p10": own.seconds_p10,
        "predicted_trial_seconds_p90": own.seconds_p90,
        "measured_trial_seconds": measured,
        # The steps the prediction is for (those the trial trained), and its optimizer-step
        # part: the report compares like with like, and the steps alone without start-up.
        "predicted_trial_steps": float(own.optimizer_steps),
        "predicted_trial_train_seconds": own.breakdown["train"],
        "trial_estimate_error_pct": 100.0 * (own.seconds_p50 - measured) / measured
        if measured > 0
        else 0.0,
        "trial_inside_band": float(own.seconds_p10 <= measured <= own.seconds_p90),
        "predicted_full_run_hours_p50": full.seconds_p50 / 3600,
        "predicted_full_run_hours_p90": full.seconds_p90 / 3600,
    }


def _hardware_section(hardware: HardwareInfo) -> dict[str, Any]:
    return {
        "device_kind": hardware.device_kind,
        "device_name": hardware.device_name,
        "memory_gb": hardware.memory_bytes / GIB,
        "cpu_cores": hardware.cpu_cores,
        "precision": hardware.precision,
    }


def rounded(value: Any) -> Any:
    """Floats to 6 significant digits, recursively: smaller storage rows, same information."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value
