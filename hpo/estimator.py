"""The study's time model: does a configuration fit the budget, and how long will it take?

Before a trial trains, `StudyEstimator.check` plans the full run the trial's configuration
would become, predicts its duration (p10-p90), cost and peak memory, and tells Optuna with
`trial.set_constraint` whether it fits; one that does not is never trained. After a trial
trained, `observe` adds its measurements to the calibration (so the next check uses them),
saves the calibration file, and reports how far the prediction of the trial's own short run
was off: the honesty metric. What would fit when nothing does is `hpo.what_fits`; the
shared calibration file is `hpo.calibration_file`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.calibrate import run_probes
from analysis.calibration.file import Calibration
from analysis.calibration.fit import fit, update
from analysis.calibration.measurements import RunMeasurements
from analysis.full_runs import FullRun, absorb
from analysis.hardware import HardwareInfo, cpu_matmul_flops, fingerprint, prior_coefficients
from analysis.loss_correction import LossCorrection
from analysis.machine import model_profile, this_machine
from analysis.planning import plan_of_spec
from analysis.records import TRIAL_ATTR, trial_record
from analysis.timemodel import BAND_PARTS, Coefficients, Estimate, ModelProfile, Plan, predict
from analysis.workload import weight_bytes
from common.fmt import format_duration
from hpo.calibration_file import CalibrationFile
from hpo.final_loss import correction_summary
from hpo.runspec import trial_spec
from search_spaces.space import gate_quantization
from trainers.run_spec import run_spec
from trainers.spec import TrainSpec, full_run_steps

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudyConfig
    from hpo.final_loss import FinalLoss
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
            "predicted_peak_memory_gb_p90": self.full_run.peak_memory_bytes_p90 / GIB,
            **{f"constraint_{name}": value for name, value in self.constraints.items()},
        }


class StudyEstimator:
    """Predicts full-run duration, cost and memory for a study's configurations.

    Args:
        config: The study configuration (budget, epochs, intervals, device).
        prepared: The prepared model and data (dataset statistics per max_length).
        hardware: The machine; default: detected as the trainer would.
        model: The model profile; default: read from `prepared.model_path` on the meta device.
        cpu_probe: Returns CPU FLOP/s for the priors; default: a short matmul probe.
    """

    def __init__(
        self,
        config: StudyConfig,
        prepared: Prepared,
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
        self.file = CalibrationFile(config.work_dir, self.fingerprint)
        self._cpu_probe = cpu_probe
        self._prior: Coefficients | None = None
        self.calibration = self.file.load()
        self.probe_runs = 0  # probe runs this estimator trained (0: none, or reused)
        if self.calibration is None and config.probe_seconds > 0:
            self.calibration = self._probe(config.probe_seconds)
        self._length_cache: dict[int, tuple[tuple[int, ...], int]] = {}
        limit_gb = config.budget.max_memory_gb
        self.memory_limit_bytes = limit_gb * GIB if limit_gb else float(self.hardware.memory_bytes)
        self.available_seconds = config.budget.available_seconds
        # What this machine lets the search propose: a 4-bit base only where the user allows
        # it or the base in the run's precision does not fit (the study samples prepared.space).
        prepared.space = gate_quantization(
            prepared.space, allowed=config.allow_quantization or not self.base_fits()
        )

    # -- the model ---------------------------------------------------------------------------
    @property
    def prior(self) -> Coefficients:
        """Uncalibrated coefficients (measured lazily: the CPU probe takes a moment)."""
        if self._prior is None:
            self._prior = prior_coefficients(self.hardware, cpu_probe=self._cpu_probe)
        return self._prior

    @property
    def calibrated(self) -> bool:
        """Whether predictions rest on measurements of this machine (not on priors alone)."""
        return self.calibration is not None

    def probe(self, seconds: float) -> None:
        """Measure this machine now (the probe design, about `seconds`) and use what it says."""
        self.calibration = self._probe(seconds)

    def _probe(self, seconds: float) -> Calibration:
        """Calibrate from the probe design before the first trial and save it for later studies.

        Runs once per hardware + model fingerprint and work dir: the next study finds the file.
        """
        config = self.config
        log.info(
            "no calibration for fingerprint %s in %s: probing this machine for about %.0f s",
            self.fingerprint,
            config.work_dir,
            seconds,
        )
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="probe-", dir=config.work_dir) as work:
            results = run_probes(
                self.prepared.model_path,
                self.prepared.data_path,
                work_dir=work,
                budget_seconds=seconds,
                device=config.device,
                precision=config.precision,
            )
        runs = [RunMeasurements.from_result_dict(r) for r in results]
        fitted = fit(runs, self.model, self.hardware, prior=self.prior)
        calibration = self.file.merged(fitted) or fitted
        self.file.save(calibration)
        self.probe_runs = len(runs)
        log.info(
            "calibrated from %d probe runs in %.0f s (calibration %s, saved to %s)",
            len(runs),
            time.perf_counter() - started,
            calibration.calibration_id,
            self.file.path,
        )
        return calibration

    @property
    def coefficients(self) -> Coefficients:
        """The calibrated coefficients when there is a calibration, else the priors."""
        return self.calibration.coefficients if self.calibration else self.prior

    def specs(
        self,
        params: Mapping[str, Any],
        *,
        epochs: float | None = None,
        max_length: int | None = None,
    ) -> tuple[TrainSpec, TrainSpec]:
        """The full run a configuration becomes, and the trial cut from it.

        Args:
            params: A complete configuration (`search_spaces.sample`).
            epochs: Instead of the study's (the what-would-fit search tries fewer).
            max_length: Instead of the configuration's (the search tries shorter ones).
        """
        if max_length is not None:  # before the trial's share: a packed run's steps follow it
            params = {**params, "max_length": max_length}
        full = run_spec(
            params, self.config, model=self.prepared.model_path, data=self.prepared.data_path
        )
        own = trial_spec(
            self.config, full, full_run_steps(full, self.train_lengths(full.max_length))
        )
        if epochs is None:
            return full, own
        return dataclasses.replace(full, epochs=epochs), dataclasses.replace(own, epochs=epochs)

    def plan(
        self,
        params: Mapping[str, Any],
        *,
        full_run: bool,
        epochs: float | None = None,
        max_length: int | None = None,
    ) -> Plan:
        """The run a configuration becomes: the full run, or the trial's own short run.

        Args:
            params: A complete configuration (`search_spaces.sample`).
            full_run: The full run instead of the trial.
            epochs: Instead of the study's (see `specs`).
            max_length: Instead of the configuration's (see `specs`).
        """
        full, own = self.specs(params, epochs=epochs, max_length=max_length)
        return self.plan_of(full if full_run else own)

    def plan_of(self, spec: TrainSpec) -> Plan:
        """The time model's plan of `spec` on this study's data and machine."""
        train, n_validation = self._lengths(spec.max_length)
        return plan_of_spec(
            spec, self.model, train, n_validation=n_validation, hardware=self.hardware
        )

    def base_fits(self) -> bool:
        """Whether the base's weights, unquantized in the run's precision, fit the memory limit."""
        weights = weight_bytes(self.model, self.hardware.precision)
        return weights < self.memory_limit_bytes

    def train_lengths(self, max_length: int) -> tuple[int, ...]:
        """Token lengths of the training samples at `max_length` (what a trial's steps count)."""
        return self._lengths(max_length)[0]

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

    def verdict(self, params: Mapping[str, Any], **plan_changes: Any) -> Verdict:
        """Predict the full run and the trial's own run; does the full run fit the budget?

        Args:
            params: A complete configuration.
            **plan_changes: `epochs` or `max_length` instead of the study's (see `specs`).
        """
        return self.judge(*self.specs(params, **plan_changes))

    def judge(self, full_run: TrainSpec, trial_run: TrainSpec) -> Verdict:
        """Predict a full run and its trial's own run; does the full run fit the budget?"""
        coefficients = self.coefficients
        full = predict(self.plan_of(full_run), coefficients)
        own = predict(self.plan_of(trial_run), coefficients)
        constraints = {
            # Relative overshoot: unit-free, so TPE can add the two when it ranks violations.
            "duration": full.seconds_p90 / self.available_seconds - 1.0,
            # The p90: an under-predicted peak is an out-of-memory crash hours in.
            "memory": full.peak_memory_bytes_p90 / self.memory_limit_bytes - 1.0,
        }
        reasons = []
        if constraints["duration"] > 0:
            reasons.append(
                f"predicted {format_duration(full.seconds_p50)} "
                f"(p90 {format_duration(full.seconds_p90)}) "
                f"> {format_duration(self.available_seconds)} available"
            )
        if constraints["memory"] > 0:
            reasons.append(
                f"predicted peak memory {full.peak_memory_bytes / GIB:.1f} GB "
                f"(p90 {full.peak_memory_bytes_p90 / GIB:.1f} GB) "
                f"> {self.memory_limit_bytes / GIB:.1f} GB limit"
            )
        return Verdict(not reasons, "; ".join(reasons), full, own, constraints, coefficients)

    @property
    def loss_correction(self) -> LossCorrection:
        """Predicted -> measured final loss, from full runs that reported back (else identity)."""
        return self.calibration.loss_correction if self.calibration else LossCorrection()

    def absorb_full_runs(self, runs: Sequence[FullRun]) -> tuple[int, int]:
        """Learn from full runs made for this fingerprint: final losses and step times.

        Returns:
            Full runs added for accuracy and for time (0, 0 when there is no calibration
            yet to add them to, or nothing new).
        """
        base = self.file.merged(self.calibration)
        if base is None or not runs:
            return 0, 0
        calibration, losses, timed = absorb(base, runs)
        if losses or timed:
            self.calibration = calibration
            self.file.save(calibration)
        return losses, timed

    # -- the objective's hooks ---------------------------------------------------------------
    def check(self, trial: optuna.Trial, full_run: TrainSpec, trial_run: TrainSpec) -> Verdict:
        """Predict the trial's full run and its own short run; tell Optuna if it fits."""
        verdict = self.judge(full_run, trial_run)
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
        runs: tuple[TrainSpec, TrainSpec],
        result: TrainResult,
        verdict: Verdict,
    ) -> dict[str, float]:
        """Calibrate with the trial's measurements; return the honesty metrics.

        Returns:
            `predicted_trial_seconds` (made before the run, for the steps it ran),
            `predicted_trial_steps` (those steps), `predicted_trial_train_seconds` (their
            optimizer-step part), `measured_trial_seconds`, `trial_estimate_error_pct`
            (+ = over-predicted), `trial_inside_band` (1 when the measurement fell inside
            p10-p90) and the full run's refreshed `predicted_full_run_hours_p50/p90`.
        """
        full_run, trial_run = runs
        own_plan = self.plan_of(trial_run)
        self._calibrate(trial, result, own_plan.eval_samples)
        own = verdict.trial_run
        if result.optimizer_steps and result.optimizer_steps != own.optimizer_steps:
            # Stopped early (pruned): judge the same coefficients on the steps that ran.
            own = predict(
                dataclasses.replace(own_plan, max_steps=result.optimizer_steps),
                verdict.coefficients,
            )
        full = predict(self.plan_of(full_run), self.coefficients)
        trial.set_user_attr(ESTIMATE_ATTR, self.estimate_section(full))
        return _honesty_metrics(own, full, result.wall_seconds)

    def _calibrate(self, trial: optuna.Trial, result: TrainResult, eval_samples: int) -> None:
        """Refit with the trial's run, save the file, and keep the run with the trial."""
        run = RunMeasurements.from_result_dict({**result.to_dict(), "eval_samples": eval_samples})
        self.calibration = update(
            self.file.merged(self.calibration) or self.prior,
            run,
            model=self.model,
            hardware=self.hardware,
        )
        self.file.save(self.calibration)
        record = trial_record(self.hardware, self.model, run.capped(STORED_MICRO_STEPS))
        trial.set_user_attr(TRIAL_ATTR, _rounded(record))

    def add_final_loss(self, trial: optuna.Trial, final: FinalLoss) -> None:
        """Put the predicted final loss into the trial's estimate, next to the duration.

        The uncorrected p50 goes along: a full run reports its measured loss against it, and
        the correction is refitted from those pairs (a corrected value would count twice).
        """
        section = dict(trial.user_attrs.get(ESTIMATE_ATTR) or {})
        section["final_val_loss"] = final.band()
        section["final_val_loss_uncorrected_p50"] = _rounded(final.fit.p50)
        section["final_val_loss_method"] = final.method
        section["final_val_loss_points"] = final.n_points
        section["loss_correction"] = correction_summary(self.loss_correction)
        trial.set_user_attr(ESTIMATE_ATTR, section)

    def estimate_section(self, estimate: Estimate) -> dict[str, Any]:
        """The preset's `estimate`: duration with interval, cost, throughput, budget, hardware."""
        budget = self.config.budget
        fits = (
            estimate.seconds_p90 <= self.available_seconds
            and estimate.peak_memory_bytes_p90 <= self.memory_limit_bytes
        )
        calibration = self.calibration
        return _rounded(
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
                "peak_memory_gb": estimate.peak_memory_bytes / GIB,
                "peak_memory_gb_p90": estimate.peak_memory_bytes_p90 / GIB,
                "memory_limit_gb": self.memory_limit_bytes / GIB,
                "fits_window": fits,
                "window_hours": budget.window_hours,
                "safety_margin_minutes": budget.safety_margin_minutes,
                "available_hours": self.available_seconds / 3600,
                "hardware": _hardware_section(self.hardware),
                "hardware_fingerprint": self.fingerprint,
                "calibration_id": calibration.calibration_id if calibration else None,
                "calibration_runs": calibration.n_measurements.get("runs", 0) if calibration else 0,
                "source": estimate.source,
                "band_pct": _band_pct(estimate),
            }
        )


def _band_pct(estimate: Estimate) -> dict[str, float]:
    """The duration band's parts as % above the median at p90: which one makes it wide."""
    return {
        part: 100.0 * math.expm1(estimate.extra.get(f"band_{part}_log_p90", 0.0))
        for part in BAND_PARTS
    }


def _honesty_metrics(own: Estimate, full: Estimate, measured: float) -> dict[str, float]:
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


def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits, recursively: smaller storage rows, same information."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value
