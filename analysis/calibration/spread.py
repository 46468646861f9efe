"""The step-time band: the model's systematic error and the machine's drift, from residuals."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import t as student_t

from analysis.calibration.measurements import RunMeasurements
from analysis.timemodel.model import Coefficients

_RUN_SD_PRIOR = 0.12  # run-to-run sd of step time before seeing repeats (5-13 % here)
_RUN_SD_FLOOR = 0.05
# The drift's sd before repeats are seen: the run-to-run prior, worth two degrees of freedom
# (as the model's prior is worth two runs). A steady machine's 5 % left a preset's full run
# outside its band on a drifting one (docs/notes/tuned-constants.md).
_DRIFT_PRIOR_SD = _RUN_SD_PRIOR
_DRIFT_PRIOR_DOF = 2


def configuration(run: RunMeasurements) -> tuple[object, ...]:
    """What makes two runs the same configuration as far as step time goes.

    The batches' typical padded length is part of it (half-octave buckets of the median):
    the same `max_length` on other data is other work. Without it a probe-design run (short
    rows) and a study's trial (long packed rows) read as one configuration, their gap as the
    machine's drift, and every p90 widened past the window (docs/notes/tuned-constants.md).
    """
    lengths = [length for length in run.micro_step_seq_len if length > 0]
    typical = round(2 * math.log2(float(np.median(lengths)))) if lengths else None
    return (
        run.micro_batch_size,
        run.max_length,
        typical,
        run.lora_r,
        run.trainable_parameters,
        run.gradient_checkpointing,
        run.quantization,
    )


def step_spread(
    log_residuals: np.ndarray,
    run_sizes: list[int],
    configs: Sequence[object],
    prior: Coefficients,
) -> tuple[float, float, float, float, float, float]:
    """Interval parameters from micro-step residuals.

    Returns step_mean_ratio, step_noise_sd, systematic_log_p10, systematic_log_p90,
    drift_log_sd and drift_log_p90.

    `step_mean_ratio` turns the robust (typical) step time into the mean, stalls included:
    a run's total is a sum, so every stall measured on this machine costs real time.
    A run's level is the median of its residuals. Levels differ for two reasons: the model
    is wrong about some configurations (shape), and the machine was faster or slower while
    the run executed (drift). Runs of one configuration (`configs` alike) differ by drift
    alone, so their pooled within-configuration variance measures the machine; what is left
    of the variance over all runs is the model's. The model's sd is a shrinkage estimate: a
    prior worth two runs, pooled with the spread of the levels as runs accumulate. Quantiles
    come from a Student t with the estimate's degrees of freedom rather than a normal: an sd
    estimated from a handful of runs is itself uncertain, which widens the band while few
    runs are measured. Without repeated configurations the drift is not told apart (0) and
    the model's band carries the whole spread, as it always did.
    """
    usable = log_residuals[np.isfinite(log_residuals)]
    if usable.size == 0:
        return (
            prior.step_mean_ratio,
            prior.step_noise_sd,
            prior.systematic_log_p10,
            prior.systematic_log_p90,
            prior.drift_log_sd,
            prior.drift_log_p90,
        )
    ratio = np.minimum(np.exp(usable), 10.0)  # one pathological pause must not rule
    mean = float(ratio.mean())
    parts = np.split(log_residuals, np.cumsum(run_sizes)[:-1])
    levels = [
        (float(np.median(part[np.isfinite(part)])), config)
        for part, config in zip(parts, configs, strict=True)
        if np.isfinite(part).any()
    ]
    k = len(levels)
    variance = float(np.var([m for m, _ in levels], ddof=1)) if k >= 2 else 0.0
    drift_var, drift_dof = _drift_variance(levels)
    shape_var = max(variance - drift_var, 0.0)
    run_sd = math.sqrt((2 * _RUN_SD_PRIOR**2 + (k - 1) * shape_var) / (k + 1))
    run_sd = max(run_sd, _RUN_SD_FLOOR)
    quantile = float(student_t.ppf(0.9, k + 1))
    drift_sd, drift_p90 = _drift_band(drift_var, drift_dof)
    return (
        mean,
        float(ratio.std()) / mean,
        -quantile * run_sd,
        quantile * run_sd,
        drift_sd,
        drift_p90,
    )


def _drift_band(variance: float, dof: int) -> tuple[float, float]:
    """The drift's sd and p90 log offset from the pooled variance of repeated configurations.

    Like the model's sd, a shrinkage estimate: a prior sd worth `_DRIFT_PRIOR_DOF` degrees of
    freedom pooled with what the repeats measured, and a Student t quantile with their sum.
    Without it one repeated pair (1 degree of freedom) set the p90 at t = 3.08 sample sds, a
    Cauchy tail: in four preset_honesty studies it alone made the drift's p90 x1.8 to x8.6
    and the bands' half-widths 74-424 %.
    Unmeasured (no repeats): 0, the model's band then carries the whole spread.
    """
    if not dof:
        return 0.0, 0.0
    prior_dof = _DRIFT_PRIOR_DOF
    pooled = (prior_dof * _DRIFT_PRIOR_SD**2 + dof * variance) / (prior_dof + dof)
    sd = math.sqrt(pooled)
    return sd, float(student_t.ppf(0.9, prior_dof + dof)) * sd


def _drift_variance(levels: Sequence[tuple[float, object]]) -> tuple[float, int]:
    """Pooled variance of run levels within configurations, and its degrees of freedom."""
    groups: dict[object, list[float]] = {}
    for level, config in levels:
        groups.setdefault(config, []).append(level)
    repeated = [np.asarray(g) for g in groups.values() if len(g) >= 2]
    dof = sum(g.size - 1 for g in repeated)
    if not dof:
        return 0.0, 0
    return float(sum(((g - g.mean()) ** 2).sum() for g in repeated)) / dof, dof
