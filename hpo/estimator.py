"""The study's time model: does a configuration fit the budget, and how long will it take?

Before a trial trains, `StudyEstimator.check` takes the full run the trial's configuration
becomes and the trial cut from it (the specs the objective built once, and trains), predicts
the full run's duration (p10-p90), cost and peak memory, and tells Optuna with
`trial.set_constraint` whether it fits; one that does not is never trained (`hpo.predictions`
holds the verdict and the records). After a trial
trained, `observe` adds its measurements to the calibration (so the next check uses them),
saves the calibration file, and reports how far the prediction of the trial's own short run
was off: the honesty metric. What would fit when nothing does is `hpo.what_fits`; the
shared calibration file is `hpo.calibration_file`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from analysis.calibrate import run_probes
from analysis.calibration.file import Calibration
from analysis.calibration.fit import fit, update
from analysis.calibration.full_runs import FullRun, absorb
from analysis.calibration.measurements import RunMeasurements
from analysis.calibration.trial_records import trial_record
from analysis.curves.correction import LossCorrection
from analysis.planning.fits import plan_of_spec
from analysis.timemodel.hardware import (
    HardwareInfo,
    cpu_matmul_flops,
    fingerprint,
    prior_coefficients,
)
from analysis.timemodel.machine import model_profile, this_machine
from analysis.timemodel.model import Coefficients, Estimate, ModelProfile, Plan, predict
from analysis.timemodel.workload import weight_bytes
from hpo.calibration_file import CalibrationFile
from hpo.final_loss import correction_summary
from hpo.keys import ESTIMATE_ATTR, TIME_MODEL_RUN_ATTR
from hpo.predictions import (
    Verdict,
    describe_estimate,
    honesty_metrics,
    rounded,
    verdict_of,
)
from hpo.trial_attrs import set_user_attrs
from hpo.trial_runs import trial_runs
from search_spaces.space import gate_quantization
from trainers.spec import TrainSpec

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudyConfig
    from hpo.final_loss import FinalLoss
    from hpo.prepare import Prepared
    from trainers.result import TrainResult


log = logging.getLogger(__name__)
STORED_MICRO_STEPS = 48  # per trial in the Optuna storage: enough to refit, small rows
GIB = 2**30
# Measured checkpoint saves (of two adapter sizes at least) after which trials stop timing one.
TIMED_SAVES_NEEDED = 4


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
        self.hardware = hardware or this_machine(config.device, config.precision)
        self.model = model or model_profile(prepared.model_path)
        self.fingerprint = fingerprint(self.hardware, self.model)
        self.file = CalibrationFile(config.work_dir, self.fingerprint)
        self._cpu_probe = cpu_probe
        self._prior: Coefficients | None = None
        limit_gb = config.budget.max_memory_gb
        self.memory_limit_bytes = limit_gb * GIB if limit_gb else float(self.hardware.memory_bytes)
        self.available_seconds = config.budget.available_seconds
        # What this machine lets the search propose: a 4-bit base only where the user allows
        # it or the base in the run's precision does not fit. The estimator keeps its own
        # copy (the caller's is left as it was); the study samples this one.
        self.prepared = dataclasses.replace(
            prepared,
            space=gate_quantization(
                prepared.space, allowed=config.allow_quantization or not self.base_fits()
            ),
        )
        self.calibration = self.file.load()
        self.probe_runs = 0  # probe runs this estimator trained (0: none, or reused)
        # The study's own full runs whose curves its fit holds: out of its loss correction.
        self.curve_runs: frozenset[str] = frozenset()
        if self.calibration is None and config.probe_seconds > 0:
            self.calibration = self._probe(config.probe_seconds)
        self._length_cache: dict[int, tuple[tuple[int, ...], int]] = {}

    def for_config(self, config: StudyConfig) -> StudyEstimator:
        """This estimator (its machine, model, space and calibration) judging the runs of
        `config`: the study's config once its search plan set the trials' fraction.

        A new estimator; this one is left as it was (and is not to be used after).
        """
        other = copy.copy(self)
        other.config = config
        return other

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
        """Calibrate from the probe design before the first trial (see `probed_calibration`)."""
        calibration, self.probe_runs = probed_calibration(self, seconds)
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
        gpus: int | None = None,
    ) -> tuple[TrainSpec, TrainSpec]:
        """The full run a configuration becomes (on `budget.gpus_per_run` GPUs), and the
        trial cut from it (on one GPU: `hpo.trial_runs.trial_runs`).

        Args:
            params: A complete configuration (`search_spaces.sample`).
            epochs: Instead of the study's (the what-would-fit search tries fewer).
            max_length: Instead of the configuration's (the search tries shorter ones).
            gpus: Instead of the study's GPUs per full run (the search tries more).
        """
        if max_length is not None:  # before the trial's share: a packed run's steps follow it
            params = {**params, "max_length": max_length}
        if gpus is not None:
            params = {**params, "gpus": gpus}
        runs = trial_runs(
            self.config,
            params,
            model=self.prepared.model_path,
            data=self.prepared.data_path,
            train_lengths=self.train_lengths,
        )
        full, own = runs.full_run, runs.trial
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
        plan = plan_of_spec(
            spec, self.model, train, n_validation=n_validation, hardware=self.hardware
        )
        if spec.gpus > 1:  # the full run's node: N of this machine's GPUs on the budget's link
            plan = dataclasses.replace(plan, interconnect=self.config.budget.interconnect)
        return plan

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
            **plan_changes: `epochs`, `max_length` or `gpus` instead of the study's (see
                `specs`).
        """
        return self.judge(*self.specs(params, **plan_changes))

    def judge(self, full_run: TrainSpec, trial_run: TrainSpec) -> Verdict:
        """Predict a full run and its trial's own run; does the full run fit the budget?"""
        coefficients = self.coefficients
        return verdict_of(
            predict(self.plan_of(full_run), coefficients),
            predict(self.plan_of(trial_run), coefficients),
            coefficients,
            available_seconds=self.available_seconds,
            memory_limit_bytes=self.memory_limit_bytes,
        )

    @property
    def loss_correction(self) -> LossCorrection:
        """Predicted -> measured final loss, from full runs that reported back (else identity),
        but those whose curves the study's fit holds (`curve_runs`)."""
        if self.calibration is None:
            return LossCorrection()
        return self.calibration.loss_correction_without(self.curve_runs)

    def absorb_full_runs(
        self, runs: Sequence[FullRun], *, curve_runs: frozenset[str] = frozenset()
    ) -> tuple[int, int]:
        """Learn from full runs made for this fingerprint: final losses and step times.

        `curve_runs`: the study's own full runs whose curves its fit holds, kept out of the
        loss correction from now on.

        Returns:
            Full runs added for accuracy and for time (0, 0 when there is no calibration
            yet to add them to, or nothing new).
        """
        self.curve_runs = curve_runs
        base = self.file.merged(self.calibration)
        if base is None or not runs:
            return 0, 0
        calibration, losses, timed = absorb(base, runs)
        if losses or timed:
            self.calibration = calibration
            self.file.save(calibration)
        return losses, timed

    # -- the objective's hooks ---------------------------------------------------------------
    def check(
        self,
        trial: optuna.Trial,
        full_run: TrainSpec,
        trial_run: TrainSpec,
        attrs: Mapping[str, Any] | None = None,
    ) -> Verdict:
        """Predict the trial's full run and its own short run; tell Optuna if it fits.

        `attrs` (the trial's configuration) go into the same storage write as the verdict's
        constraints and attributes.
        """
        verdict = self.judge(full_run, trial_run)
        values = {
            **(attrs or {}),
            ESTIMATE_ATTR: self.describe(verdict.full_run),
            # What the check used (prior or which calibration): `estimate` is refreshed later.
            "time_model_source": verdict.coefficients.source,
            "predicted_trial_seconds": verdict.trial_run.seconds_p50,
        }
        set_user_attrs(trial, values, constraints=verdict.constraints)
        return verdict

    def knows_checkpoint_cost(self) -> bool:
        """Whether the calibration has measured saves enough to predict a full run's saves
        (`save_cost_known`); a trial need not time another one then."""
        return save_cost_known(self.calibration.runs if self.calibration else ())

    def observe(
        self,
        runs: tuple[TrainSpec, TrainSpec],
        result: TrainResult,
        verdict: Verdict,
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """Calibrate with the trial's measurements; return the honesty metrics and the
        trial's attributes.

        Args:
            runs: Its full run and its own run, as `check` judged them and the trial trained.
            result: What the trial's run measured.
            verdict: What `check` said before it trained.

        Returns:
            The honesty metrics: `predicted_trial_seconds` (made before the run, for the steps it ran),
            `predicted_trial_steps` (those steps), `predicted_trial_train_seconds` (their
            optimizer-step part), `measured_trial_seconds`, `trial_estimate_error_pct`
            (+ = over-predicted), `trial_inside_band` (1 when the measurement fell inside
            p10-p90) and the full run's refreshed `predicted_full_run_hours_p50/p90`; and the
            trial's attributes the objective writes at its end: its measurements record
            (`TIME_MODEL_RUN_ATTR`) and the refreshed estimate (`ESTIMATE_ATTR`).
        """
        full_run, trial_run = runs
        own_plan = self.plan_of(trial_run)
        record = self._calibrate(result, own_plan.eval_samples)
        own = verdict.trial_run
        if result.optimizer_steps and result.optimizer_steps != own.optimizer_steps:
            # Stopped early (pruned): judge the same coefficients on the steps that ran.
            own = predict(
                dataclasses.replace(own_plan, max_steps=result.optimizer_steps),
                verdict.coefficients,
            )
        full = predict(self.plan_of(full_run), self.coefficients)
        attrs = {TIME_MODEL_RUN_ATTR: record, ESTIMATE_ATTR: self.describe(full)}
        return honesty_metrics(own, full, result.wall_seconds), attrs

    def _calibrate(self, result: TrainResult, eval_samples: int) -> dict[str, Any]:
        """Refit with the trial's run and save the file; the run's record for the trial."""
        run = RunMeasurements.from_result_dict({**result.to_dict(), "eval_samples": eval_samples})
        self.calibration = update(
            self.file.merged(self.calibration) or self.prior,
            run,
            model=self.model,
            hardware=self.hardware,
        )
        self.file.save(self.calibration)
        record = trial_record(self.hardware, self.model, run.capped(STORED_MICRO_STEPS))
        return dict(rounded(record))

    def with_final_loss(
        self, estimate: Mapping[str, Any] | None, final: FinalLoss
    ) -> dict[str, Any]:
        """The trial's estimate (as `observe` returned it) with the predicted final loss next
        to the duration.

        The uncorrected p50 goes along: a full run reports its measured loss against it, and
        the correction is refitted from those pairs (a corrected value would count twice).
        """
        section = dict(estimate or {})
        section["final_val_loss"] = final.band()
        section["final_val_loss_uncorrected_p50"] = rounded(final.fit.p50)
        section["final_val_loss_method"] = final.method
        section["final_val_loss_points"] = final.n_points
        section["loss_correction"] = correction_summary(final.correction, len(self.curve_runs))
        return section

    def describe(self, estimate: Estimate) -> dict[str, Any]:
        """`estimate` as the preset's `estimate` section, with this study's budget, machine and
        calibration (`hpo.predictions.describe_estimate`)."""
        return describe_estimate(
            estimate,
            budget=self.config.budget,
            memory_limit_bytes=self.memory_limit_bytes,
            hardware=self.hardware,
            fingerprint=self.fingerprint,
            calibration=self.calibration,
        )


def save_cost_known(runs: Sequence[RunMeasurements]) -> bool:
    """Whether `runs` measured enough checkpoint saves to fit what a save costs.

    A save costs a fixed time plus a time per adapter parameter (`analysis.timemodel.model`):
    `TIMED_SAVES_NEEDED` measured saves of at least two adapter sizes fit both terms. Workers
    share the calibration file, so what one measured counts for all; runs that fall out of
    the stored ones bring the trials' saves back.
    """
    timed = [r for r in runs if r.checkpoint_seconds]
    saves = sum(len(r.checkpoint_seconds) for r in timed)
    return saves >= TIMED_SAVES_NEEDED and len({r.trainable_parameters for r in timed}) >= 2


def probed_calibration(estimator: StudyEstimator, seconds: float) -> tuple[Calibration, int]:
    """Calibrate from the probe design before the first trial and save it for later studies.

    Runs once per hardware + model fingerprint and work dir: the next study finds the file.

    Returns:
        The calibration (merged with the file's), and the probe runs trained.
    """
    config, prepared, file = estimator.config, estimator.prepared, estimator.file
    log.info(
        "no calibration for fingerprint %s in %s: probing this machine for about %.0f s",
        estimator.fingerprint,
        config.work_dir,
        seconds,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="probe-", dir=config.work_dir) as work:
        results = run_probes(
            prepared.model_path,
            prepared.data_path,
            work_dir=work,
            budget_seconds=seconds,
            device=config.device,
            precision=config.precision,
        )
    runs = [RunMeasurements.from_result_dict(r) for r in results]
    fitted = fit(runs, estimator.model, estimator.hardware, prior=estimator.prior)
    calibration = file.merged(fitted) or fitted
    file.save(calibration)
    log.info(
        "calibrated from %d probe runs in %.0f s (calibration %s, saved to %s)",
        len(runs),
        time.perf_counter() - started,
        calibration.calibration_id,
        file.path,
    )
    return calibration, len(runs)
