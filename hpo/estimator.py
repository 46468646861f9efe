"""The study's time model: does a configuration fit the budget, and how long will it take?

Before a trial trains, `StudyEstimator.check` plans the full run the trial's configuration
would become, predicts its duration (p10-p90), cost and peak memory, and tells Optuna with
`trial.set_constraint` whether it fits; one that does not is never trained. After a trial
trained, `observe` adds its measurements to the calibration (so the next check uses them),
saves the calibration file, and reports how far the prediction of the trial's own short run
was off: the honesty metric.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.calibrate import CALIBRATION_FILE, TRIAL_ATTR, trial_record
from analysis.calibration import Calibration, RunMeasurements, load_for, update
from analysis.machine import model_profile, this_machine
from analysis.timemodel import (
    Coefficients,
    Estimate,
    HardwareInfo,
    ModelProfile,
    Plan,
    cpu_matmul_flops,
    fingerprint,
    predict,
    prior_coefficients,
)
from common.errors import BadInputError
from common.fmt import format_duration
from search_spaces import Choice, IntRange

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudyConfig
    from hpo.prepare import Prepared
    from trainers.result import TrainResult

log = logging.getLogger(__name__)

ESTIMATE_ATTR = "estimate"  # the preset's `estimate` section (hpo.export reads it)
STORED_MICRO_STEPS = 48  # per trial in the Optuna storage: enough to refit, small rows
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
            **{f"constraint_{name}": value for name, value in self.constraints.items()},
        }


def budget_estimator_factory(
    config: StudyConfig, prepared: Prepared
) -> Callable[[StudyConfig, Prepared, optuna.Study], StudyEstimator]:
    """Build the study's estimator now and stop if nothing in the space fits the budget.

    Called between `prepare` and the creation of the Optuna study, so a budget nothing fits
    ends the command (exit 2) before anything is written.

    Returns:
        The `estimator_factory` `run_study` calls once the study exists.
    """
    estimator = StudyEstimator(config, prepared)
    estimator.check_space()
    return lambda _config, _prepared, _study: estimator


class StudyEstimator:
    """Predicts full-run duration, cost and memory for a study's configurations.

    Args:
        config: The study configuration (budget, epochs, intervals, device).
        prepared: The prepared model and data (dataset statistics per max_length).
        study: The Optuna study (unused; the factory signature of `run_study`).
        hardware: The machine; default: detected as the trainer would.
        model: The model profile; default: read from `prepared.model_path` on the meta device.
        cpu_probe: Returns CPU FLOP/s for the priors; default: a short matmul probe.
    """

    def __init__(
        self,
        config: StudyConfig,
        prepared: Prepared,
        study: optuna.Study | None = None,
        *,
        hardware: HardwareInfo | None = None,
        model: ModelProfile | None = None,
        cpu_probe: Callable[[], float] = cpu_matmul_flops,
    ) -> None:
        self.config = config
        self.prepared = prepared
        self.hardware = hardware or this_machine(config.device, config.precision)
        self.model = model or model_profile(prepared.model_path)
        self.fingerprint = fingerprint(self.hardware, self.model)
        self.path = Path(config.work_dir) / CALIBRATION_FILE
        self._cpu_probe = cpu_probe
        self._prior: Coefficients | None = None
        self._length_cache: dict[int, tuple[tuple[int, ...], int]] = {}
        self.calibration, warning = load_for(self.path, self.fingerprint)
        if warning:
            log.warning(warning)
        limit_gb = config.budget.max_memory_gb
        self.memory_limit_bytes = limit_gb * GIB if limit_gb else float(self.hardware.memory_bytes)
        self.available_seconds = config.budget.available_seconds

    # -- the model ---------------------------------------------------------------------------
    @property
    def prior(self) -> Coefficients:
        """Uncalibrated coefficients (measured lazily: the CPU probe takes a moment)."""
        if self._prior is None:
            self._prior = prior_coefficients(self.hardware, cpu_probe=self._cpu_probe)
        return self._prior

    @property
    def coefficients(self) -> Coefficients:
        """The calibrated coefficients when there is a calibration, else the priors."""
        return self.calibration.coefficients if self.calibration else self.prior

    def plan(
        self,
        params: Mapping[str, Any],
        *,
        full_run: bool,
        epochs: float | None = None,
        max_length: int | None = None,
    ) -> Plan:
        """The run a configuration becomes: the full run, or the trial's own short run."""
        config = self.config
        length = int(max_length or params["max_length"])
        train, n_validation = self._lengths(length)
        return Plan(
            model=self.model,
            token_lengths=train,
            epochs=epochs if epochs is not None else config.epochs,
            micro_batch_size=int(params["micro_batch_size"]),
            gradient_accumulation_steps=int(params["gradient_accumulation_steps"]),
            max_length=length,
            lora_r=int(params["lora_r"]),
            eval_interval_steps=config.full_eval_interval if full_run else config.eval_interval,
            eval_samples=min(config.eval_samples, n_validation),
            checkpoint_interval_steps=config.full_checkpoint_interval if full_run else 0,
            gradient_checkpointing=bool(params["gradient_checkpointing"]),
            precision=self.hardware.precision,
            device_kind=self.hardware.device_kind,
            max_steps=None if full_run else config.trial_max_steps,
        )

    def _lengths(self, max_length: int) -> tuple[tuple[int, ...], int]:
        """Train token lengths at `max_length` and the number of validation samples.

        `DatasetStats.lengths` lists the train samples first. A max_length that was not
        tokenized (a profile outside the study's) is approximated by clipping the longest
        tokenization there is.
        """
        if max_length not in self._length_cache:
            stats = self.prepared.dataset_stats
            n_train = self.prepared.train_samples
            if max_length in stats:
                lengths = list(stats[max_length].lengths)
            else:
                lengths = [min(n, max_length) for n in stats[max(stats)].lengths]
            self._length_cache[max_length] = (
                tuple(lengths[:n_train]),
                max(len(lengths) - n_train, 0),
            )
        return self._length_cache[max_length]

    def _verdict(self, params: Mapping[str, Any], **plan_changes: Any) -> Verdict:
        coefficients = self.coefficients
        full = predict(self.plan(params, full_run=True, **plan_changes), coefficients)
        own = predict(self.plan(params, full_run=False, **plan_changes), coefficients)
        constraints = {
            # Relative overshoot: unit-free, so TPE can add the two when it ranks violations.
            "duration": full.seconds_p90 / self.available_seconds - 1.0,
            "memory": full.peak_memory_bytes / self.memory_limit_bytes - 1.0,
        }
        reasons = []
        if constraints["duration"] > 0:
            reasons.append(
                f"predicted {format_duration(full.seconds_p50)} (p90 {format_duration(full.seconds_p90)}) "
                f"> {format_duration(self.available_seconds)} available"
            )
        if constraints["memory"] > 0:
            reasons.append(
                f"predicted peak memory {full.peak_memory_bytes / GIB:.1f} GB "
                f"> {self.memory_limit_bytes / GIB:.1f} GB limit"
            )
        return Verdict(not reasons, "; ".join(reasons), full, own, constraints, coefficients)

    # -- the objective's hooks ---------------------------------------------------------------
    def check(
        self, trial: optuna.Trial, params: Mapping[str, Any], derived: Mapping[str, Any]
    ) -> Verdict:
        """Predict the trial's full run and its own short run; tell Optuna if it fits."""
        verdict = self._verdict(params)
        for name, value in verdict.constraints.items():
            trial.set_constraint(name, value)
        trial.set_user_attr(ESTIMATE_ATTR, self.estimate_section(verdict.full_run))
        # What the check used (prior or which calibration): `estimate` is refreshed later.
        trial.set_user_attr("time_model_source", verdict.coefficients.source)
        trial.set_user_attr("predicted_trial_seconds", verdict.trial_run.seconds_p50)
        return verdict

    def observe(
        self,
        trial: optuna.Trial,
        params: Mapping[str, Any],
        result: TrainResult,
        verdict: Verdict,
    ) -> dict[str, float]:
        """Calibrate with the trial's measurements; return the honesty metrics.

        Returns:
            `predicted_trial_seconds` (made before the run, for the steps it ran),
            `measured_trial_seconds`, `trial_estimate_error_pct` (+ = over-predicted),
            `trial_inside_band` (1 when the measurement fell inside p10-p90) and the full
            run's refreshed `predicted_full_run_hours_p50/p90`.
        """
        own_plan = self.plan(params, full_run=False)
        run = RunMeasurements.from_result_dict(
            {**result.to_dict(), "eval_samples": own_plan.eval_samples}
        )
        self.calibration = update(
            self._latest() or self.prior, run, model=self.model, hardware=self.hardware
        )
        self.calibration.save(self.path)
        record = trial_record(self.hardware, self.model, run.capped(STORED_MICRO_STEPS))
        trial.set_user_attr(TRIAL_ATTR, _rounded(record))

        own = verdict.trial_run
        if result.optimizer_steps and result.optimizer_steps != own.optimizer_steps:
            # Stopped early (pruned): judge the same coefficients on the steps that ran.
            own = predict(
                dataclasses.replace(own_plan, max_steps=result.optimizer_steps),
                verdict.coefficients,
            )
        full = predict(self.plan(params, full_run=True), self.coefficients)
        trial.set_user_attr(ESTIMATE_ATTR, self.estimate_section(full))
        measured = result.wall_seconds
        return {
            "predicted_trial_seconds": own.seconds_p50,
            "predicted_trial_seconds_p10": own.seconds_p10,
            "predicted_trial_seconds_p90": own.seconds_p90,
            "measured_trial_seconds": measured,
            "trial_estimate_error_pct": 100.0 * (own.seconds_p50 - measured) / measured
            if measured > 0
            else 0.0,
            "trial_inside_band": float(own.seconds_p10 <= measured <= own.seconds_p90),
            "predicted_full_run_hours_p50": full.seconds_p50 / 3600,
            "predicted_full_run_hours_p90": full.seconds_p90 / 3600,
        }

    def _latest(self) -> Calibration | None:
        """Our calibration, merged with the file when another worker has written it since."""
        on_disk, _ = load_for(self.path, self.fingerprint)
        if on_disk is None or self.calibration is None:
            return on_disk or self.calibration
        if on_disk.calibration_id == self.calibration.calibration_id:
            return self.calibration
        ours = [r for r in self.calibration.runs if r not in on_disk.runs]
        return dataclasses.replace(on_disk, runs=(*on_disk.runs, *ours))

    def estimate_section(self, estimate: Estimate) -> dict[str, Any]:
        """The preset's `estimate`: duration with interval, cost, throughput, budget, hardware."""
        budget = self.config.budget
        hours = {
            "p10": estimate.seconds_p10 / 3600,
            "p50": estimate.seconds_p50 / 3600,
            "p90": estimate.seconds_p90 / 3600,
        }
        fits = (
            estimate.seconds_p90 <= self.available_seconds
            and estimate.peak_memory_bytes <= self.memory_limit_bytes
        )
        calibration = self.calibration
        return _rounded(
            {
                "method": "time model: start-up + steps x (accumulation x micro-step + optimizer "
                "step) + evaluations + checkpoints",
                "duration_hours": hours,
                "breakdown_hours": {k: v / 3600 for k, v in estimate.breakdown.items()},
                "cost": estimate.cost(budget.price_per_hour),
                "price_per_hour": budget.price_per_hour,
                "tokens_per_second": estimate.tokens_per_second,
                "optimizer_steps": estimate.optimizer_steps,
                "peak_memory_gb": estimate.peak_memory_bytes / GIB,
                "memory_limit_gb": self.memory_limit_bytes / GIB,
                "fits_window": fits,
                "window_hours": budget.window_hours,
                "safety_margin_minutes": budget.safety_margin_minutes,
                "available_hours": self.available_seconds / 3600,
                "hardware": {
                    "device_kind": self.hardware.device_kind,
                    "device_name": self.hardware.device_name,
                    "memory_gb": self.hardware.memory_bytes / GIB,
                    "cpu_cores": self.hardware.cpu_cores,
                    "precision": self.hardware.precision,
                },
                "hardware_fingerprint": self.fingerprint,
                "calibration_id": calibration.calibration_id if calibration else None,
                "calibration_runs": calibration.n_measurements.get("runs", 0) if calibration else 0,
                "source": estimate.source,
            }
        )

    # -- nothing fits ------------------------------------------------------------------------
    def check_space(self) -> None:
        """Raise when no configuration of the allowed profiles fits, saying what would.

        Tries in order: a faster profile of the space, fewer epochs (the most that fit, by
        bisection), a shorter max_length.

        Raises:
            BadInputError: Nothing fits; the one-line message carries the suggestion.
        """
        space = self.prepared.space
        allowed = tuple(self.config.profiles or space.profile_names)
        fastest, params = self._fastest(allowed)
        if fastest.feasible:
            return
        head = (
            f"no configuration fits the budget: the fastest ({_describe(params)}) is "
            f"{fastest.reason}"
        )
        others = tuple(name for name in space.profiles if name not in allowed)
        if others:
            verdict, params = self._fastest(others)
            if verdict.feasible:
                raise BadInputError(
                    f"{head}; a faster profile would fit: --profiles {params['profile']} "
                    f"({_describe(params)}, p90 {format_duration(verdict.full_run.seconds_p90)})"
                )
        epochs = self._most_epochs(allowed)
        if epochs is not None:
            raise BadInputError(f"{head}; fewer epochs would fit: --epochs {epochs:g}")
        shorter = self._shorter_max_length(allowed)
        if shorter is not None:
            length, profile = shorter
            raise BadInputError(
                f"{head}; a shorter max_length would fit: {length} tokens with profile "
                f"'{profile}' (set max_length in the space's profiles)"
            )
        raise BadInputError(
            f"{head}; no faster profile, fewer epochs or shorter max_length fits either: "
            "a longer window, more memory or faster hardware is needed"
        )

    def _candidates(self, profiles: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every time-relevant discrete choice of these profiles."""
        space = self.prepared.space
        ranks = _values(space.domains.get("lora_r"), default=8)
        for name in profiles:
            profile = space.profiles[name]
            for mb in profile.micro_batch_size:
                for ga in profile.gradient_accumulation_steps:
                    for rank in ranks:
                        yield {
                            "profile": name,
                            "micro_batch_size": mb,
                            "gradient_accumulation_steps": ga,
                            "max_length": profile.max_length,
                            "gradient_checkpointing": profile.gradient_checkpointing,
                            "lora_r": rank,
                        }

    def _fastest(
        self, profiles: Sequence[str], **plan_changes: Any
    ) -> tuple[Verdict, dict[str, Any]]:
        """The feasible candidate with the lowest p90, else the fastest one, and its verdict."""
        best: tuple[tuple[bool, float], Verdict, dict[str, Any]] | None = None
        for params in self._candidates(profiles):
            verdict = self._verdict(params, **plan_changes)
            key = (not verdict.feasible, verdict.full_run.seconds_p90)
            if best is None or key < best[0]:
                best = (key, verdict, params)
        if best is None:
            raise BadInputError(f"profiles: {list(profiles)} offer no configuration")
        return best[1], best[2]

    def _most_epochs(self, profiles: Sequence[str]) -> float | None:
        """The largest epoch count (2 significant digits, rounded down) that fits, if any."""
        low, high = self.config.epochs * 1e-4, self.config.epochs
        if not self._fastest(profiles, epochs=low)[0].feasible:
            return None
        for _ in range(30):  # bisection in log space: low fits, high does not
            middle = math.sqrt(low * high)
            if self._fastest(profiles, epochs=middle)[0].feasible:
                low = middle
            else:
                high = middle
        digits = 1 - math.floor(math.log10(low))
        rounded = math.floor(low * 10**digits) / 10**digits
        return rounded if rounded > 0 else None

    def _shorter_max_length(self, profiles: Sequence[str]) -> tuple[int, str] | None:
        """The longest max_length (halving from the longest) at which something fits."""
        space = self.prepared.space
        length = max(space.profiles[name].max_length for name in profiles) // 2
        while length >= 16:
            longer = [n for n in profiles if space.profiles[n].max_length > length]
            verdict, params = self._fastest(longer, max_length=length)
            if verdict.feasible:
                return length, str(params["profile"])
            length //= 2
        return None


def _values(domain: object, *, default: int) -> tuple[int, ...]:
    """The integer choices of a discrete domain; a range's two ends (time is monotone)."""
    if isinstance(domain, Choice):
        return tuple(int(v) for v in domain.values if isinstance(v, (int, float)))
    if isinstance(domain, IntRange):
        return (domain.low, domain.high)
    return (default,)


def _describe(params: Mapping[str, Any]) -> str:
    return (
        f"profile {params['profile']}, micro_batch_size {params['micro_batch_size']}, "
        f"accumulation {params['gradient_accumulation_steps']}, lora_r {params['lora_r']}"
    )


def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits, recursively: smaller storage rows, same information."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value
