"""Fit the time model's coefficients to measured training runs.

A calibration belongs to one hardware + model fingerprint. It stores the (capped)
measurements it was fitted to, so `update` can refit with one more run cheaply and a
calibration carries over from one study to the next.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime, timezone

import numpy as np

from analysis.calibration.file import MAX_STORED_RUNS, VERSION, Calibration, LossRun
from analysis.calibration.measurements import RunMeasurements
from analysis.calibration.memory import fit_memory, memory_margin, reserved_ratio
from analysis.calibration.robust_fit import robust_positive_fit
from analysis.calibration.spread import configuration, step_spread
from analysis.timemodel.hardware import HardwareInfo, fingerprint, prior_coefficients
from analysis.timemodel.model import Coefficients, ModelProfile
from analysis.timemodel.workload import adapter_flops, attention_flops, frozen_flops


def _micro_rates(c: Coefficients) -> np.ndarray:
    """The micro-step coefficients in the column order of `_micro_rows`."""
    return np.array(
        [
            c.micro_fixed_seconds,
            c.micro_seconds_per_flop,
            c.adapter_seconds_per_flop,
            c.micro_seconds_per_attention_flop,
        ]
    )


# A run's steps at padded lengths it has not seen yet are fitted apart (`new_shape_seconds`)
# when at least this share of its steady steps repeats a length; else all are fitted together.
MIN_REPEATED_SHARE = 0.25


def _micro_features(run: RunMeasurements, model: ModelProfile) -> tuple[np.ndarray, np.ndarray]:
    """Features and seconds of every micro-step of `run` (warm-up included)."""
    tokens = np.asarray(run.micro_step_tokens, dtype=np.float64)
    seq = np.maximum(np.asarray(run.micro_step_seq_len, dtype=np.float64), 1.0)
    gc = run.gradient_checkpointing
    features = np.column_stack(
        [
            np.ones_like(tokens),
            frozen_flops(model.compute_parameters, 1.0, gc) * tokens,
            adapter_flops(run.trainable_parameters, 1.0, gc) * tokens,
            attention_flops(model, 1.0, gc) * tokens * seq,  # b * s^2 = tokens * s
        ]
    )
    # An NF4 run's steps are fitted as the unquantized run's: `predict` applies the factor.
    seconds = np.asarray(run.micro_step_seconds, dtype=np.float64) / run.step_factor
    return features, seconds


def _steady(run: RunMeasurements) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the steady micro-steps that repeat a padded length, and of those that do not.

    When too few steps repeat one (every batch a new length), all steady steps are fitted as
    repeats and none apart: the two costs cannot be told apart in that run.
    """
    n = len(run.micro_step_seconds)
    steady = np.arange(n) >= run.warmup_steps
    new = steady & np.asarray(run.micro_step_new_shape, dtype=bool)
    repeated = steady & ~new
    if repeated.sum() < max(3, MIN_REPEATED_SHARE * steady.sum()):
        return steady, np.zeros(n, dtype=bool)
    return repeated, new


def _micro_rows(run: RunMeasurements, model: ModelProfile) -> tuple[np.ndarray, np.ndarray]:
    features, seconds = _micro_features(run, model)
    repeated, _ = _steady(run)
    return features[repeated], seconds[repeated]


def _stack(rows: list[tuple[np.ndarray, np.ndarray]], width: int) -> tuple[np.ndarray, np.ndarray]:
    if not rows:
        return np.zeros((0, width)), np.zeros(0)
    return np.vstack([r[0] for r in rows]), np.concatenate([r[1] for r in rows])


def _pairs(values: Sequence[float], feature: float) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(values, dtype=np.float64)
    return np.column_stack([np.ones_like(y), np.full_like(y, feature)]), y


def fit(
    runs: Sequence[RunMeasurements],
    model: ModelProfile,
    hardware: HardwareInfo,
    *,
    prior: Coefficients | None = None,
    loss_runs: Sequence[LossRun] = (),
) -> Calibration:
    """Fit the time and memory model to measured runs.

    Args:
        runs: Measurements of runs of `model` on `hardware` (any configurations).
        model: The model profile.
        hardware: The machine the runs executed on.
        prior: Starting coefficients; components without measurements keep them.
            Defaults to `prior_coefficients(hardware)` (runs a short CPU probe on CPU).
        loss_runs: Full runs' final losses, carried over (they do not enter the time fit).

    Returns:
        A calibration holding the fitted coefficients and the capped runs.
    """
    prior = prior if prior is not None else prior_coefficients(hardware)
    stored = newest_runs(tuple(run.capped() for run in runs), MAX_STORED_RUNS)
    coefficients, counts = _fit_coefficients(stored, model, hardware, prior)
    key = fingerprint(hardware, model)
    content = json.dumps(
        [key, coefficients.to_dict(), [r.to_dict() for r in stored]], sort_keys=True
    )
    calibration_id = hashlib.sha256(content.encode()).hexdigest()[:10]
    return Calibration(
        version=VERSION,
        fingerprint=key,
        hardware=hardware,
        model=model,
        coefficients=dataclasses.replace(coefficients, source=f"calibration:{calibration_id}"),
        prior=prior,
        n_measurements=counts,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        calibration_id=calibration_id,
        runs=stored,
        loss_runs=tuple(loss_runs)[-MAX_STORED_RUNS:],
    )


# Runs that measured a term most runs do not: only the run that loaded the base model
# measures start-up (a worker keeps it for its other trials), and trials stop timing their
# checkpoint save once a few are known. Dropped with the oldest runs, the term fell back to
# its prior (start-up 10 s on a CPU), every configuration of a tight window was then judged
# too slow and refused, and a refused trial measures nothing: after its 50th trained trial
# a study (hpo_efficiency.py's task) trained nothing more. The newest few are kept.
_RARE_TERMS_KEPT = 8


def newest_runs(runs: Sequence[RunMeasurements], limit: int) -> tuple[RunMeasurements, ...]:
    """The newest `limit` runs, in order, holding on to the newest `_RARE_TERMS_KEPT` that
    measured start-up and those that timed checkpoint saves (older common runs give way)."""
    if len(runs) <= limit:
        return tuple(runs)
    rare = {
        i
        for measured in (
            [i for i, r in enumerate(runs) if r.startup_seconds > 0],
            [i for i, r in enumerate(runs) if r.checkpoint_seconds],
        )
        for i in measured[-_RARE_TERMS_KEPT:]
    }
    rare = set(sorted(rare)[-limit:])
    common = [i for i in range(len(runs)) if i not in rare][::-1][: limit - len(rare)]
    return tuple(runs[i] for i in sorted(rare | set(common)))


def _fit_coefficients(
    stored: Sequence[RunMeasurements],
    model: ModelProfile,
    hardware: HardwareInfo,
    prior: Coefficients,
) -> tuple[Coefficients, dict[str, int]]:
    """Every term of the time and memory model, each fitted to its own measurements."""
    p = prior
    n_params = float(model.total_parameters)
    micro_rows = [_micro_rows(run, model) for run in stored]
    x, y = _stack(micro_rows, 4)
    micro, res = robust_positive_fit(x, y, _micro_rates(p))
    optimizer, n_optimizer = _fit_two_terms(
        [
            _pairs(r.optimizer_step_seconds[r.optimizer_warmup_steps :], r.trainable_parameters)
            for r in stored
        ],
        (p.optimizer_fixed_seconds, p.optimizer_seconds_per_parameter),
    )
    evals, n_eval = _fit_evaluations(stored, float(model.compute_parameters), p)
    checkpoint, n_checkpoint = _fit_two_terms(
        [_pairs(r.checkpoint_seconds, r.trainable_parameters) for r in stored],
        (p.checkpoint_fixed_seconds, p.checkpoint_seconds_per_parameter),
    )
    startup, n_startup = _fit_two_terms(
        [_pairs([r.startup_seconds], n_params) for r in stored if r.startup_seconds > 0],
        (p.startup_fixed_seconds, p.startup_seconds_per_parameter),
    )
    memory, n_memory = fit_memory(stored, model, hardware, prior)
    margin = memory_margin(stored, model, hardware, prior)
    spread = step_spread(
        res, [len(rows[1]) for rows in micro_rows], [configuration(r) for r in stored], prior
    )
    loops = [r.loop_seconds / r.loop_micro_steps for r in stored if r.loop_micro_steps > 0]
    loop = max(float(np.median(loops)), 0.0) if loops else prior.loop_seconds_per_micro_step
    coefficients = dataclasses.replace(
        prior,
        micro_fixed_seconds=float(micro[0]),
        micro_seconds_per_flop=float(micro[1]),
        micro_seconds_per_adapter_flop=float(micro[2]),
        micro_seconds_per_attention_flop=float(micro[3]),
        optimizer_fixed_seconds=float(optimizer[0]),
        optimizer_seconds_per_parameter=float(optimizer[1]),
        eval_fixed_seconds=float(evals[0]),
        eval_seconds_per_batch=float(evals[1]),
        eval_seconds_per_flop=float(evals[2]),
        checkpoint_fixed_seconds=float(checkpoint[0]),
        checkpoint_seconds_per_parameter=float(checkpoint[1]),
        startup_fixed_seconds=float(startup[0]),
        startup_seconds_per_parameter=float(startup[1]),
        memory_fixed_bytes=float(memory[0]),
        activation_memory_scale=float(memory[1]),
        step_mean_ratio=spread[0],
        step_noise_sd=spread[1],
        systematic_log_p10=spread[2],
        systematic_log_p90=spread[3],
        drift_log_sd=spread[4],
        drift_log_p90=spread[5],
        memory_log_p90=margin,
        reserved_over_allocated=reserved_ratio(stored, prior),
        loop_seconds_per_micro_step=loop,
    )
    coefficients, n_warmup = _fit_warmup(stored, model, coefficients)
    coefficients, n_new_shape = _fit_new_shapes(stored, model, coefficients)
    counts = {
        "runs": len(stored),
        "micro_step": int(np.isfinite(res).sum()),
        "optimizer_step": n_optimizer,
        "eval": n_eval,
        "checkpoint": n_checkpoint,
        "startup": n_startup,
        "memory": n_memory,
        "loop": len(loops),
        "warmup": n_warmup,
        "new_shape": n_new_shape,
    }
    return coefficients, counts


def _fit_two_terms(
    rows: list[tuple[np.ndarray, np.ndarray]], prior: tuple[float, float]
) -> tuple[np.ndarray, int]:
    """A fixed cost plus a rate per unit (parameters): the fit and how many measurements."""
    x, y = _stack(rows, 2)
    coefficients, _ = robust_positive_fit(x, y, np.array(prior))
    return coefficients, int(y.size)


def _fit_evaluations(
    stored: Sequence[RunMeasurements], n_params: float, p: Coefficients
) -> tuple[np.ndarray, int]:
    """One evaluation = a fixed cost + a cost per batch + a cost per forward FLOP."""
    x, y = _stack(
        [
            (
                np.column_stack(
                    [
                        np.ones(len(r.eval_tokens)),
                        np.full(len(r.eval_tokens), float(r.eval_batches)),
                        2.0 * n_params * np.asarray(r.eval_tokens, dtype=np.float64),
                    ]
                ),
                np.asarray(r.eval_seconds, dtype=np.float64),
            )
            for r in stored
        ],
        3,
    )
    coefficients, _ = robust_positive_fit(
        x, y, np.array([p.eval_fixed_seconds, p.eval_seconds_per_batch, p.eval_seconds_per_flop])
    )
    return coefficients, int(y.size)


def _fit_warmup(
    stored: Sequence[RunMeasurements], model: ModelProfile, c: Coefficients
) -> tuple[Coefficients, int]:
    """`c` with the warm-up cost: the median extra time of the runs' warm-up steps."""
    warmups = [
        _warmup_extra(r, model, c)
        for r in stored
        if r.warmup_steps and len(r.micro_step_seconds) > r.warmup_steps
    ]
    if warmups:
        c = dataclasses.replace(c, warmup_seconds=max(float(np.median(warmups)), 0.0))
    return c, len(warmups)


def _fit_new_shapes(
    stored: Sequence[RunMeasurements], model: ModelProfile, c: Coefficients
) -> tuple[Coefficients, int]:
    """`c` with the median extra seconds of a steady step at a padded length not seen before."""
    rates = _micro_rates(c)
    extras: list[np.ndarray] = []
    for run in stored:
        _, new = _steady(run)
        if new.any():
            features, seconds = _micro_features(run, model)
            steady = (features[new] @ rates) * c.step_mean_ratio
            extras.append((seconds[new] - steady) * run.step_factor)  # in real seconds
    if not extras:
        return c, 0
    pooled = np.concatenate(extras)
    return dataclasses.replace(c, new_shape_seconds=max(float(np.median(pooled)), 0.0)), pooled.size


def _warmup_extra(run: RunMeasurements, model: ModelProfile, c: Coefficients) -> float:
    """Seconds the warm-up steps of `run` took beyond what steady steps would have."""
    w = run.warmup_steps
    features, _ = _micro_features(run, model)
    rates = _micro_rates(c)
    steady = float((features[:w] @ rates).sum()) * c.step_mean_ratio * run.step_factor
    extra = float(sum(run.micro_step_seconds[:w])) - steady
    if run.optimizer_warmup_steps:
        optimizer = c.optimizer_fixed_seconds + c.optimizer_seconds_per_parameter * (
            run.trainable_parameters
        )
        extra += run.optimizer_step_seconds[0] - optimizer
    return extra


def update(
    base: Calibration | Coefficients,
    new_run: RunMeasurements,
    *,
    model: ModelProfile | None = None,
    hardware: HardwareInfo | None = None,
) -> Calibration:
    """Refit with one more run.

    Args:
        base: A calibration (its stored runs and prior are reused) or prior coefficients.
        new_run: The run just measured.
        model: Required when `base` is a prior.
        hardware: Required when `base` is a prior.
    """
    if isinstance(base, Calibration):
        return fit(
            (*base.runs, new_run),
            base.model,
            base.hardware,
            prior=base.prior,
            loss_runs=base.loss_runs,
        )
    if model is None or hardware is None:
        raise ValueError("update() from prior coefficients needs model= and hardware=")
    return fit((new_run,), model, hardware, prior=base)
