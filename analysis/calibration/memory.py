"""Peak memory: the fit of its fixed and activation parts, and the margin of its p90."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import t as student_t

from analysis.calibration.measurements import RunMeasurements
from analysis.calibration.robust_fit import (
    PRIOR_LOG_SD,
    leave_one_out_fits,
    robust_positive_fit,
)
from analysis.timemodel.hardware import HardwareInfo
from analysis.timemodel.model import Coefficients, ModelProfile
from analysis.timemodel.workload import activation_bytes, static_memory_bytes

# Peak memory: a held-out run's log(measured / predicted) has about this sd before any is
# seen (worth two runs); the p90 never sits less than 5 % above the median (on CPU the
# process's resident memory only ratchets up from one run to the next, by 1-5 % here).
_MEMORY_SD_PRIOR = 0.03
_MEMORY_LOG_P90_FLOOR = math.log(1.05)
# On a CPU the peak is the process's resident memory, and what a calibration's short probes
# cannot show is how far it grows in a longer run with evaluations and checkpoint saves in
# the same process (allocator fragmentation): 2-6 % above the median on the accuracy
# benchmark's held-out runs (docs/benchmarks/time_model_accuracy.md;
# its runs are in docs/measurements/time-model-accuracy-cpu-*.json, which
# tests/test_memory_bound.py replays).
_CPU_MEMORY_LOG_P90_FLOOR = math.log(1.10)
_MEMORY_HOLDOUT_RUNS = 20  # the newest runs whose leave-one-out error sets the margin
# The fixed part is held close to its prior (runtime overhead is well known).
_MEMORY_PRIOR_LOG_SD = np.array([0.5, PRIOR_LOG_SD])


def _memory_features(
    run: RunMeasurements, model: ModelProfile, hardware: HardwareInfo
) -> tuple[float, float]:
    """Activation bytes of the run's longest micro-batch and its static bytes."""
    activation = activation_bytes(
        model,
        run.micro_batch_size,
        max(run.micro_step_seq_len),
        hardware.precision,
        run.gradient_checkpointing,
        hardware.device_kind,
        fused_loss="liger" in run.levers,
    )
    static = static_memory_bytes(
        model, run.trainable_parameters, hardware.precision, run.quantization
    )
    return activation, static


def fit_memory(
    runs: Sequence[RunMeasurements],
    model: ModelProfile,
    hardware: HardwareInfo,
    prior: Coefficients,
    start: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Fit (fixed bytes, activation scale) to measured peaks above the static memory.

    The fixed part is held close to its prior (runtime overhead is well known); with one run
    the least squares effectively solves for the activation scale alone. `start`: a fit to
    nearly the same runs to start from (`robust_positive_fit`).
    """
    measured = [r for r in runs if r.peak_memory_bytes > 0 and r.micro_step_seq_len]
    if not measured:
        return np.array([prior.memory_fixed_bytes, prior.activation_memory_scale]), 0
    activation, static = np.array([_memory_features(r, model, hardware) for r in measured]).T
    peaks = np.array([float(r.peak_memory_bytes) for r in measured])
    coef, _ = robust_positive_fit(
        np.column_stack([np.ones_like(activation), activation]),
        peaks,
        _memory_prior(prior),
        offset=static,
        prior_log_sd=_MEMORY_PRIOR_LOG_SD,
        start=start,
    )
    return coef, len(measured)


def _memory_prior(prior: Coefficients) -> np.ndarray:
    return np.array([prior.memory_fixed_bytes, prior.activation_memory_scale])


def reserved_ratio(runs: Sequence[RunMeasurements], prior: Coefficients) -> float:
    """What the CUDA allocator reserved over what tensors held at the peak, for the runs that
    measured both: the largest (the bound is compared with the device's memory, and one
    run's fragmentation is the next one's out-of-memory); the prior's without any.

    Trials run on the study's own data, so the shapes that fragment the cache (unpacked
    samples of varied lengths) show in their ratio.
    """
    ratios = [
        r.peak_reserved_bytes / r.peak_memory_bytes
        for r in runs
        if r.peak_reserved_bytes > 0 and r.peak_memory_bytes > 0
    ]
    return max(1.0, *ratios) if ratios else prior.reserved_over_allocated


def memory_margin(
    runs: Sequence[RunMeasurements],
    model: ModelProfile,
    hardware: HardwareInfo,
    prior: Coefficients,
) -> float:
    """log(p90 / p50) of peak memory, from how well each run is predicted by the others.

    The fit passes close to every run it is given, so its own residuals understate the error
    on a configuration it has not seen; leaving each run out in turn does not. The p90 sits
    the mean under-prediction (never a credit for over-predicting) plus a Student t quantile
    of their shrunk sd above the median, never below the worst under-prediction seen (with
    a few runs that is about their p80, and the errors are skewed: on CPU a process's
    resident memory ratchets up, so late runs measure high) and never below the floor (a
    higher one on a CPU, for what the probes cannot show).
    """
    measured = [r for r in runs if r.peak_memory_bytes > 0 and r.micro_step_seq_len]
    measured = measured[-_MEMORY_HOLDOUT_RUNS:]
    if len(measured) < 2:
        return prior.memory_log_p90
    # Each leave-one-out fit starts from the fit to all of them: one run moves it little.
    everything, _ = fit_memory(measured, model, hardware, prior)
    activation, static = np.array([_memory_features(r, model, hardware) for r in measured]).T
    peaks = np.array([float(r.peak_memory_bytes) for r in measured])
    without = leave_one_out_fits(
        np.column_stack([np.ones_like(activation), activation]),
        peaks,
        _memory_prior(prior),
        everything,
        offset=static,
        prior_log_sd=_MEMORY_PRIOR_LOG_SD,
    )
    predicted = without[:, 0] + static + without[:, 1] * activation
    errors = [float(e) for e in np.log(peaks / predicted)]
    k = len(errors)
    bias = max(float(np.mean(errors)), 0.0)
    sd = math.sqrt((2 * _MEMORY_SD_PRIOR**2 + (k - 1) * float(np.var(errors, ddof=1))) / (k + 1))
    upper = bias + float(student_t.ppf(0.9, k + 1)) * sd
    floor = _CPU_MEMORY_LOG_P90_FLOOR if hardware.device_kind == "cpu" else _MEMORY_LOG_P90_FLOOR
    return max(upper, max(errors), floor)
