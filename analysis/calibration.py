"""Fit the time model's coefficients to measured training runs, and keep them on disk.

A calibration belongs to one hardware + model fingerprint. It stores the (capped)
measurements it was fitted to, so `update` can refit with one more run cheaply and a
calibration carries over from one study to the next.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import t as student_t

from analysis.learning_curve import LossCorrection, fit_loss_correction
from analysis.timemodel import (
    Coefficients,
    HardwareInfo,
    ModelProfile,
    activation_bytes,
    adapter_flops,
    attention_flops,
    fingerprint,
    frozen_flops,
    prior_coefficients,
    static_memory_bytes,
)
from common.errors import BadInputError
from common.files import write_atomic
from trainers.spec import eval_batch_size

FORMAT = "hpo-calibration"
VERSION = 1
WARMUP_MICRO_STEPS = 3
MAX_STORED_MICRO_STEPS = 200
MAX_STORED_RUNS = 50
_F_SCALE = 0.1  # log-ratio scale where the robust loss turns from quadratic to flat
_PRIOR_LOG_SD = 2.0  # a weak pull to the prior: decides only what the data leave open
_RUN_SD_PRIOR = 0.12  # run-to-run sd of step time before seeing repeats (5-13 % here)
_RUN_SD_FLOOR = 0.05
# The drift's sd before repeats are seen: the run-to-run prior, worth two degrees of freedom
# (as the model's prior is worth two runs). A 5 % prior (a steady machine's) left a preset's
# full run outside its band on this VM: one pair 12 % apart pooled to x1.14 at p90, and the
# run took 23 % longer than the median (preset_honesty, 2026-11-23).
_DRIFT_PRIOR_SD = _RUN_SD_PRIOR
_DRIFT_PRIOR_DOF = 2
# Peak memory: a held-out run's log(measured / predicted) has about this sd before any is
# seen (worth two runs); the p90 never sits less than 5 % above the median (on CPU the
# process's resident memory only ratchets up from one run to the next, by 1-5 % here).
_MEMORY_SD_PRIOR = 0.03
_MEMORY_LOG_P90_FLOOR = math.log(1.05)
_MEMORY_HOLDOUT_RUNS = 20  # the newest runs whose leave-one-out error sets the margin


@dataclass(frozen=True)
class RunMeasurements:
    """What one real training run measured (the trainer's result JSON).

    Attributes:
        micro_step_seconds: Wall time of each micro-step (forward + backward).
        micro_step_tokens: Padded tokens of each micro-batch.
        micro_step_seq_len: Padded length of each micro-batch.
        micro_batch_size: Configured samples per micro-batch.
        optimizer_step_seconds: Wall time of each optimizer step.
        eval_seconds: Wall time of each evaluation.
        eval_tokens: Tokens evaluated in each evaluation.
        checkpoint_seconds: Wall time of each checkpoint save.
        startup_seconds: Process start to first step.
        peak_memory_bytes: Peak memory of the run (0 = not measured).
        lora_r: LoRA rank.
        trainable_parameters: Trainable parameters of the run.
        gradient_checkpointing: Whether activations were recomputed.
        max_length: Truncation length.
        warmup_steps: Leading micro-steps that are warm-up: they calibrate the warm-up cost,
            not the step rates; when > 0 the first optimizer step is warm-up too.
        loop_seconds: Training time outside the timed micro- and optimizer steps (fetching
            and collating batches, the loop's bookkeeping), over the whole run.
        loop_micro_steps: Micro-steps of the whole run that `loop_seconds` covers.
        eval_samples: Samples per evaluation (0 = unknown).
    """

    micro_step_seconds: tuple[float, ...]
    micro_step_tokens: tuple[int, ...]
    micro_step_seq_len: tuple[int, ...]
    micro_batch_size: int
    optimizer_step_seconds: tuple[float, ...]
    eval_seconds: tuple[float, ...]
    eval_tokens: tuple[int, ...]
    checkpoint_seconds: tuple[float, ...]
    startup_seconds: float
    peak_memory_bytes: int
    lora_r: int
    trainable_parameters: int
    gradient_checkpointing: bool
    max_length: int
    warmup_steps: int = WARMUP_MICRO_STEPS
    loop_seconds: float = 0.0
    loop_micro_steps: int = 0
    eval_samples: int = 0

    def __post_init__(self) -> None:
        n = len(self.micro_step_seconds)
        if len(self.micro_step_tokens) != n or len(self.micro_step_seq_len) != n:
            raise BadInputError(
                "micro_step_seconds, micro_step_tokens and micro_step_seq_len must have the "
                f"same length but got {n}, {len(self.micro_step_tokens)}, "
                f"{len(self.micro_step_seq_len)}"
            )
        if len(self.eval_seconds) != len(self.eval_tokens):
            raise BadInputError("eval_seconds and eval_tokens must have the same length")
        if self.micro_batch_size < 1 or self.trainable_parameters < 1:
            raise BadInputError(
                "micro_batch_size and trainable_parameters must be >= 1 but got "
                f"{self.micro_batch_size=}, {self.trainable_parameters=}"
            )

    @classmethod
    def from_result_dict(cls, data: Mapping[str, Any]) -> RunMeasurements:
        """Read a trainer result dict; config keys may sit at the top or under "config"."""
        config = data.get("config") or {}

        def get(key: str, default: Any = None) -> Any:
            if key in data:
                return data[key]
            if key in config:
                return config[key]
            if default is not None:
                return default
            raise BadInputError(f"run measurements lack the field {key!r}")

        try:
            evals = list(get("eval_records", []))
            micro = tuple(float(x) for x in get("micro_step_seconds"))
            optimizer = tuple(float(x) for x in get("optimizer_step_seconds", []))
            loop, loop_steps = _loop_time(data, micro, optimizer)
            return cls(
                micro_step_seconds=micro,
                micro_step_tokens=tuple(int(x) for x in get("micro_step_tokens")),
                micro_step_seq_len=tuple(int(x) for x in get("micro_step_seq_len")),
                micro_batch_size=int(get("micro_batch_size")),
                optimizer_step_seconds=optimizer,
                eval_seconds=tuple(float(e["seconds"]) for e in evals),
                eval_tokens=tuple(int(e["tokens"]) for e in evals),
                checkpoint_seconds=tuple(float(x) for x in get("checkpoint_seconds", [])),
                # A trial on a base model kept from an earlier trial did not load it: its
                # start-up says nothing of a full run's (0: not fitted).
                startup_seconds=0.0
                if data.get("reused_base_model")
                else float(get("startup_seconds", 0.0)),
                peak_memory_bytes=int(get("peak_memory_bytes", 0)),
                lora_r=int(get("lora_r")),
                trainable_parameters=int(get("trainable_parameters")),
                gradient_checkpointing=bool(get("gradient_checkpointing", False)),
                max_length=int(get("max_length")),
                warmup_steps=int(data.get("warmup_steps", WARMUP_MICRO_STEPS)),
                loop_seconds=loop,
                loop_micro_steps=loop_steps,
                eval_samples=_eval_samples(data, config, evals),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BadInputError):
                raise
            raise BadInputError(f"malformed run measurements: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict that `from_result_dict` reads back."""
        data = dataclasses.asdict(self)
        data["eval_records"] = [
            {"seconds": s, "tokens": t}
            for s, t in zip(self.eval_seconds, self.eval_tokens, strict=True)
        ]
        del data["eval_seconds"], data["eval_tokens"]
        return data

    @property
    def optimizer_warmup_steps(self) -> int:
        """Leading optimizer steps that are warm-up: the first one allocates AdamW's state."""
        return 1 if self.warmup_steps and self.optimizer_step_seconds else 0

    @property
    def eval_batches(self) -> int:
        """Forward calls per evaluation (`trainers.spec.eval_batch_size` samples each)."""
        return math.ceil(self.eval_samples / eval_batch_size(self.micro_batch_size))

    def capped(self, max_micro_steps: int = MAX_STORED_MICRO_STEPS) -> RunMeasurements:
        """Keep the warm-up steps and at most `max_micro_steps` evenly spaced steady ones.

        Even spacing keeps stalls in proportion, so the spread fitted later is unchanged.
        Capping twice changes nothing.
        """
        w = min(self.warmup_steps, len(self.micro_step_seconds))
        keep = [
            *range(w),
            *(w + i for i in _even(len(self.micro_step_seconds) - w, max_micro_steps)),
        ]
        o = self.optimizer_warmup_steps
        opt_keep = [
            *range(o),
            *(o + i for i in _even(len(self.optimizer_step_seconds) - o, max_micro_steps)),
        ]
        return dataclasses.replace(
            self,
            micro_step_seconds=tuple(self.micro_step_seconds[i] for i in keep),
            micro_step_tokens=tuple(self.micro_step_tokens[i] for i in keep),
            micro_step_seq_len=tuple(self.micro_step_seq_len[i] for i in keep),
            optimizer_step_seconds=tuple(self.optimizer_step_seconds[i] for i in opt_keep),
        )


def _loop_time(
    data: Mapping[str, Any], micro: Sequence[float], optimizer: Sequence[float]
) -> tuple[float, int]:
    """Loop time outside the timed steps: stored as such, or derived from the trainer's timings."""
    if "loop_seconds" in data:
        return float(data["loop_seconds"]), int(data.get("loop_micro_steps", 0))
    timings = data.get("timings") or {}
    if "train" in timings and micro:
        return float(timings["train"]) - sum(micro) - sum(optimizer), len(micro)
    return 0.0, 0


def _eval_samples(
    data: Mapping[str, Any], config: Mapping[str, Any], evals: Sequence[Mapping[str, Any]]
) -> int:
    """Samples per evaluation: recorded, or estimated from the tokens and the mean length."""
    for source in (data, config):
        if source.get("eval_samples"):
            return int(source["eval_samples"])
    mean = float((data.get("dataset") or {}).get("tokens_mean") or 0.0)
    if evals and mean > 0:
        return max(1, round(float(evals[0]["tokens"]) / mean))
    return 0


def _even(n: int, limit: int) -> list[int]:
    if n <= 0:
        return []
    if n <= limit:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, limit)})


# ----------------------------------------------------------------------------- robust fit


def _robust_loss(name: str, n_data: int) -> Callable[[np.ndarray], np.ndarray]:
    """Robust loss on the data residuals, plain squares on the prior-penalty residuals."""

    def loss(z: np.ndarray) -> np.ndarray:
        rho = np.empty((3, z.size))
        d = z[:n_data]
        if name == "soft_l1":
            t = 1.0 + d
            rho[0, :n_data] = 2.0 * (np.sqrt(t) - 1.0)
            rho[1, :n_data] = 1.0 / np.sqrt(t)
            rho[2, :n_data] = -0.5 * t**-1.5
        else:  # cauchy: the pull of a gross outlier fades, so x3 stalls do not bias the fit
            rho[0, :n_data] = np.log1p(d)
            rho[1, :n_data] = 1.0 / (1.0 + d)
            rho[2, :n_data] = -1.0 / (1.0 + d) ** 2
        rho[0, n_data:] = z[n_data:]
        rho[1, n_data:] = 1.0
        rho[2, n_data:] = 0.0
        return rho

    return loss


def _robust_positive_fit(
    features: np.ndarray,
    observed: np.ndarray,
    prior: np.ndarray,
    *,
    offset: np.ndarray | None = None,
    prior_log_sd: np.ndarray | float = _PRIOR_LOG_SD,
) -> tuple[np.ndarray, np.ndarray]:
    """Fit observed ~ offset + features @ coef with coef > 0, robustly, on log ratios.

    Coefficients are parametrised as prior * exp(theta): positive, well scaled whatever the
    units, and a weak Gaussian prior on theta settles directions the data cannot see (a
    feature that never varies, a component never measured). Log residuals make the noise
    relative (5 % of a slow step weighs what 5 % of a fast one does). A soft-L1 pass finds
    the basin; a Cauchy pass then all but ignores gross outliers.

    Returns:
        The coefficients and the log residuals log(observed / predicted), NaN where an
        observation was unusable (not finite or not positive).
    """
    prior = np.maximum(np.asarray(prior, dtype=np.float64), 1e-300)
    base = np.zeros_like(observed) if offset is None else offset
    ok = np.isfinite(observed) & (observed > 0) & np.all(np.isfinite(features), axis=1)
    x, y, base = features[ok], observed[ok], base[ok]
    sd = np.broadcast_to(np.asarray(prior_log_sd, dtype=np.float64), prior.shape)
    if y.size == 0:
        return prior.copy(), np.full(observed.shape, np.nan)

    def predicted(theta: np.ndarray) -> np.ndarray:
        return np.maximum(base + x @ (prior * np.exp(theta)), 1e-300)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([np.log(predicted(theta) / y), _F_SCALE * theta / sd])

    start_scale = float(np.median(np.log(y / predicted(np.zeros_like(prior)))))
    theta = np.full(prior.shape, np.clip(start_scale, -30.0, 30.0))
    for name in ("soft_l1", "cauchy"):
        theta = least_squares(
            residuals, theta, loss=_robust_loss(name, y.size), f_scale=_F_SCALE, x_scale=1.0
        ).x
    full = np.full(observed.shape, np.nan)
    full[ok] = np.log(y / predicted(theta))
    return prior * np.exp(theta), full


# ----------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class LossRun:
    """One full run's final validation loss against its trial's uncorrected prediction."""

    run_id: str  # the full run's MLflow run id, or its result file: one record per run
    predicted: float  # the trial's p50 before any correction
    measured: float  # the full run's final validation loss

    def __post_init__(self) -> None:
        for name in ("predicted", "measured"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite loss > 0, but got {value=}")


@dataclass(frozen=True)
class Calibration:
    """Fitted coefficients for one hardware + model fingerprint, with their evidence."""

    version: int
    fingerprint: str
    hardware: HardwareInfo
    model: ModelProfile
    coefficients: Coefficients
    prior: Coefficients
    n_measurements: dict[str, int]
    created_at: str
    calibration_id: str
    runs: tuple[RunMeasurements, ...] = field(default=(), repr=False)
    # Accuracy evidence: full runs' measured final validation loss against what their trial
    # predicted before any correction. The correction the estimator applies is fitted from it.
    loss_runs: tuple[LossRun, ...] = field(default=(), repr=False)

    @property
    def loss_correction(self) -> LossCorrection:
        """Predicted -> measured final loss, fitted from `loss_runs` (identity with none)."""
        return fit_loss_correction([(r.predicted, r.measured) for r in self.loss_runs])

    def with_loss_runs(self, new: Sequence[LossRun]) -> Calibration:
        """This calibration with more full runs' losses; a run id already held is replaced."""
        ids = {r.run_id for r in new}
        kept = tuple(r for r in self.loss_runs if r.run_id not in ids)
        return dataclasses.replace(self, loss_runs=(*kept, *new)[-MAX_STORED_RUNS:])

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON document `save` writes."""
        return {
            "format": FORMAT,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "calibration_id": self.calibration_id,
            "created_at": self.created_at,
            "hardware": dataclasses.asdict(self.hardware),
            "model": dataclasses.asdict(self.model),
            "coefficients": self.coefficients.to_dict(),
            "prior": self.prior.to_dict(),
            "n_measurements": dict(self.n_measurements),
            "runs": [run.to_dict() for run in self.runs],
            "loss": {
                "correction": self.loss_correction.to_dict(),
                "runs": [dataclasses.asdict(r) for r in self.loss_runs],
            },
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON atomically (a reader never sees half a file)."""
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=1))


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


def _micro_rows(run: RunMeasurements, model: ModelProfile) -> tuple[np.ndarray, np.ndarray]:
    start = run.warmup_steps
    tokens = np.asarray(run.micro_step_tokens[start:], dtype=np.float64)
    seq = np.maximum(np.asarray(run.micro_step_seq_len[start:], dtype=np.float64), 1.0)
    gc = run.gradient_checkpointing
    features = np.column_stack(
        [
            np.ones_like(tokens),
            frozen_flops(model.compute_parameters, 1.0, gc) * tokens,
            adapter_flops(run.trainable_parameters, 1.0, gc) * tokens,
            attention_flops(model, 1.0, gc) * tokens * seq,  # b * s^2 = tokens * s
        ]
    )
    return features, np.asarray(run.micro_step_seconds[start:], dtype=np.float64)


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
    stored = tuple(run.capped() for run in runs)[-MAX_STORED_RUNS:]
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
    micro, res = _robust_positive_fit(x, y, _micro_rates(p))
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
    memory, n_memory = _fit_memory(stored, model, hardware, prior)
    memory_margin = _memory_margin(stored, model, hardware, prior)
    spread = _spread(
        res, [len(rows[1]) for rows in micro_rows], [_config(r) for r in stored], prior
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
        memory_log_p90=memory_margin,
        loop_seconds_per_micro_step=loop,
    )
    warmups = [
        _warmup_extra(r, model, coefficients)
        for r in stored
        if r.warmup_steps and len(r.micro_step_seconds) > r.warmup_steps
    ]
    if warmups:
        coefficients = dataclasses.replace(
            coefficients, warmup_seconds=max(float(np.median(warmups)), 0.0)
        )
    counts = {
        "runs": len(stored),
        "micro_step": int(np.isfinite(res).sum()),
        "optimizer_step": n_optimizer,
        "eval": n_eval,
        "checkpoint": n_checkpoint,
        "startup": n_startup,
        "memory": n_memory,
        "loop": len(loops),
        "warmup": len(warmups),
    }
    return coefficients, counts


def _fit_two_terms(
    rows: list[tuple[np.ndarray, np.ndarray]], prior: tuple[float, float]
) -> tuple[np.ndarray, int]:
    """A fixed cost plus a rate per unit (parameters): the fit and how many measurements."""
    x, y = _stack(rows, 2)
    coefficients, _ = _robust_positive_fit(x, y, np.array(prior))
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
    coefficients, _ = _robust_positive_fit(
        x, y, np.array([p.eval_fixed_seconds, p.eval_seconds_per_batch, p.eval_seconds_per_flop])
    )
    return coefficients, int(y.size)


def _warmup_extra(run: RunMeasurements, model: ModelProfile, c: Coefficients) -> float:
    """Seconds the warm-up steps of `run` took beyond what steady steps would have."""
    w = run.warmup_steps
    features, _ = _micro_rows(dataclasses.replace(run, warmup_steps=0), model)
    rates = _micro_rates(c)
    steady = float((features[:w] @ rates).sum()) * c.step_mean_ratio
    extra = float(sum(run.micro_step_seconds[:w])) - steady
    if run.optimizer_warmup_steps:
        optimizer = c.optimizer_fixed_seconds + c.optimizer_seconds_per_parameter * (
            run.trainable_parameters
        )
        extra += run.optimizer_step_seconds[0] - optimizer
    return extra


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
    )
    return activation, static_memory_bytes(model, run.trainable_parameters, hardware.precision)


def _memory_peak(
    run: RunMeasurements, model: ModelProfile, hardware: HardwareInfo, coef: np.ndarray
) -> float:
    """Peak memory predicted for `run` by (fixed bytes, activation scale) `coef`."""
    activation, static = _memory_features(run, model, hardware)
    return float(coef[0] + static + coef[1] * activation)


def _fit_memory(
    runs: Sequence[RunMeasurements],
    model: ModelProfile,
    hardware: HardwareInfo,
    prior: Coefficients,
) -> tuple[np.ndarray, int]:
    """Fit (fixed bytes, activation scale) to measured peaks above the static memory.

    The fixed part is held close to its prior (runtime overhead is well known); with one run
    the least squares effectively solves for the activation scale alone.
    """
    measured = [r for r in runs if r.peak_memory_bytes > 0 and r.micro_step_seq_len]
    if not measured:
        return np.array([prior.memory_fixed_bytes, prior.activation_memory_scale]), 0
    activation, static = np.array([_memory_features(r, model, hardware) for r in measured]).T
    peaks = np.array([float(r.peak_memory_bytes) for r in measured])
    coef, _ = _robust_positive_fit(
        np.column_stack([np.ones_like(activation), activation]),
        peaks,
        np.array([prior.memory_fixed_bytes, prior.activation_memory_scale]),
        offset=static,
        prior_log_sd=np.array([0.5, _PRIOR_LOG_SD]),
    )
    return coef, len(measured)


def _config(run: RunMeasurements) -> tuple[object, ...]:
    """What makes two runs the same configuration as far as step time goes."""
    return (
        run.micro_batch_size,
        run.max_length,
        run.lora_r,
        run.trainable_parameters,
        run.gradient_checkpointing,
    )


def _spread(
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


def _memory_margin(
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
    resident memory ratchets up, so late runs measure high) and never below the floor.
    """
    measured = [r for r in runs if r.peak_memory_bytes > 0 and r.micro_step_seq_len]
    measured = measured[-_MEMORY_HOLDOUT_RUNS:]
    if len(measured) < 2:
        return prior.memory_log_p90
    errors = []
    for i, run in enumerate(measured):
        coef, _ = _fit_memory([*measured[:i], *measured[i + 1 :]], model, hardware, prior)
        predicted = _memory_peak(run, model, hardware, coef)
        errors.append(math.log(run.peak_memory_bytes / predicted))
    k = len(errors)
    bias = max(float(np.mean(errors)), 0.0)
    sd = math.sqrt((2 * _MEMORY_SD_PRIOR**2 + (k - 1) * float(np.var(errors, ddof=1))) / (k + 1))
    upper = bias + float(student_t.ppf(0.9, k + 1)) * sd
    return max(upper, max(errors), _MEMORY_LOG_P90_FLOOR)


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


# ----------------------------------------------------------------------------- files


def load(path: str | os.PathLike[str]) -> Calibration:
    """Read a calibration file.

    Raises:
        BadInputError: Unreadable, malformed, or written by a newer version.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"cannot read calibration file {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInputError(f"{path} is not a calibration file (format != {FORMAT!r})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BadInputError(f"{path}: calibration version must be an integer but got {version=}")
    if version > VERSION:
        raise BadInputError(
            f"{path}: calibration version {version} is newer than this hpo reads ({VERSION})"
        )
    try:
        return Calibration(
            version=version,
            fingerprint=str(data["fingerprint"]),
            hardware=HardwareInfo(**data["hardware"]),
            model=ModelProfile(**data["model"]),
            coefficients=Coefficients.from_dict(data["coefficients"]),
            prior=Coefficients.from_dict(data["prior"]),
            n_measurements={str(k): int(v) for k, v in data["n_measurements"].items()},
            created_at=str(data["created_at"]),
            calibration_id=str(data["calibration_id"]),
            runs=tuple(RunMeasurements.from_result_dict(r) for r in data["runs"]),
            loss_runs=tuple(LossRun(**r) for r in (data.get("loss") or {}).get("runs", [])),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInputError(f"{path}: malformed calibration file: {exc!r}") from exc


def load_for(
    path: str | os.PathLike[str], expected_fingerprint: str
) -> tuple[Calibration | None, str | None]:
    """Load the calibration at `path` if it matches `expected_fingerprint`.

    Returns:
        (calibration, None) on a match; (None, warning) when the file is for other hardware
        or another model, and the caller falls back to priors; (None, None) if no file.

    Raises:
        BadInputError: The file exists but is malformed or too new.
    """
    if not Path(path).exists():
        return None, None
    calibration = load(path)
    if calibration.fingerprint != expected_fingerprint:
        return None, (
            f"calibration {path} is for fingerprint {calibration.fingerprint} "
            f"({calibration.hardware.device_name}), not {expected_fingerprint}; using priors"
        )
    return calibration, None
