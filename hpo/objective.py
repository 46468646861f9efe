"""One trial: sample -> plan -> (feasible?) -> short training -> value, tracked in MLflow."""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from common.errors import BadInputError, TrainingFailed
from common.fmt import format_duration
from common.mlflow_writer import run_id_now
from common.workdir import WorkDir
from hpo.config import StudyConfig
from hpo.estimator import StudyEstimator
from hpo.final_loss import FinalLoss, predict_final_loss, study_peers, trial_curve, trial_score
from hpo.keys import (
    DUPLICATE_OF_ATTR,
    ESTIMATE_ATTR,
    FRACTION_ATTR,
    LAW_CURVE_ATTR,
    MEASUREMENT_ATTR,
    MLFLOW_RUN_ATTR,
    NEVER_TRAINED_ATTR,
    PROMOTED_FROM_ATTR,
    SCORED_BY_ATTR,
    STATE_REASON_ATTR,
)
from hpo.pick import rung_of
from hpo.prepare import Prepared
from hpo.states import trials_snapshot
from hpo.tracking import NOTE_TAG, RunRef, Tracker, TrialMetrics
from hpo.trial_attrs import set_user_attrs
from hpo.trial_runs import trial_runs
from search_spaces import sample
from trainers.events import EvalInfo, TrainingCallback
from trainers.result import TrainResult
from trainers.spec import TrainSpec

if TYPE_CHECKING:
    from hpo.search_budget import BudgetKeeper


def _drop_checkpoints(output_dir: str | Path) -> None:
    """A trial's checkpoints: timed, or kept for a rung to resume; then they go."""
    from trainers.loop.checkpoint import checkpoints

    for _, path in checkpoints(output_dir):
        shutil.rmtree(path, ignore_errors=True)


def drop_trial_checkpoints(study: optuna.Study, config: StudyConfig) -> None:
    """The checkpoints the study's trials kept for its rungs, once the rungs are over."""
    work = WorkDir(config.work_dir)
    for frozen in study.get_trials(deepcopy=False):
        _drop_checkpoints(work.trial(frozen.number))


def _take_checkpoint(source: Path, target: Path) -> bool:
    """Move the newest valid checkpoint of the trial a promotion continues into its own
    folder; False where there is none (the promotion then trains from the start)."""
    from trainers.loop.checkpoint import latest_valid

    found = latest_valid(source)
    if found is None:
        return False
    target.mkdir(parents=True, exist_ok=True)
    shutil.move(str(found), str(target / found.name))
    return True


def promoted_before(study: optuna.Study, trial_number: int, promoted_from: Any) -> int | None:
    """The trial, numbered before `trial_number`, that already promotes trial `promoted_from`
    and has not failed; None if there is none.

    Workers ending at once may each queue the same configuration's promotion (reading the
    study and queueing a trial are two steps); the first queued promotes it, the others end
    without training.
    """
    for frozen in study.get_trials(deepcopy=False):
        if (
            frozen.number < trial_number
            and frozen.user_attrs.get(PROMOTED_FROM_ATTR) == promoted_from
            and frozen.state != optuna.trial.TrialState.FAIL
        ):
            return frozen.number
    return None


def _first_run_id(study: optuna.Study, number: Any) -> str | None:
    """The MLflow run of trial `number` of `study`, if it recorded one."""
    for frozen in study.get_trials(deepcopy=False):
        if frozen.number == int(number):
            run_id = frozen.user_attrs.get(MLFLOW_RUN_ATTR)
            return str(run_id) if run_id else None
    return None


@dataclass
class StudyContext:
    """What every trial of one study shares."""

    config: StudyConfig
    prepared: Prepared  # the model, the data and the space, resolved once
    tracker: Tracker
    parent_run_id: str
    estimator: StudyEstimator
    budget: BudgetKeeper | None = None  # the search budget: stops a trial that would cross it


def study_rungs(context: StudyContext) -> tuple[tuple[int, float], ...]:
    """The study's rungs (K, F): as many as its search budget's plan holds, where it has one."""
    budget = context.budget
    if budget is not None and budget.plan.budget_hours is not None:
        return budget.plan.rungs
    return context.config.trial.promotions


class OptunaReporter(TrainingCallback):
    """Reports each validation loss to the pruner; asks the run to stop when pruned.

    The pruner compares trials at equal data, not at equal optimizer steps: evaluation k of
    a trial's `evals` comes after k / evals of its samples, whatever its batch size, and is
    reported as step k. A promoted trial continues the grid beyond the first trial's end.
    """

    def __init__(
        self, trial: optuna.Trial, *, stop_after_steps: int, evals: int, prune: bool = True
    ) -> None:
        self.trial = trial
        self.prune = prune
        self.stop_after_steps = stop_after_steps
        self.evals = evals
        self.last_reported = 0
        self.pruned_at: int | None = None

    def on_eval(self, info: EvalInfo) -> bool:
        rung = round(self.evals * info.step / self.stop_after_steps)
        if rung <= self.last_reported:
            return False  # a second evaluation at the same fidelity: nothing new to compare
        self.last_reported = rung
        if not self.prune:
            return False
        self.trial.report(info.loss, rung)
        if self.trial.should_prune():
            self.pruned_at = info.step
            return True
        return False


class Objective:
    """Callable handed to `study.optimize`."""

    def __init__(self, context: StudyContext) -> None:
        self.context = context
        # One base model, tokenizer and tokenized data for all of this worker's trials.
        from trainers.loop.inputs import RunInputs

        self.inputs = RunInputs(freeze_gc=True) if context.config.reuse_base_model else None

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        ctx = self.context
        config = ctx.config
        prepared = ctx.prepared
        promoted_from = trial.user_attrs.get(PROMOTED_FROM_ATTR)
        if promoted_from is not None:
            twin = promoted_before(trial.study, trial.number, promoted_from)
            if twin is not None:
                reason = f"trial {twin} already promotes trial {promoted_from}"
                set_user_attrs(trial, {STATE_REASON_ATTR: reason, DUPLICATE_OF_ATTR: twin})
                raise optuna.TrialPruned(reason)
        params = sample(trial, prepared.space, config.profiles, gpus=config.gpus)
        fraction = self._fraction(trial)
        # The trial's one pair: the feasibility check, the time model and the trainer take it.
        runs = trial_runs(
            config,
            params,
            model=prepared.model_path,
            data=prepared.data_path,
            train_lengths=ctx.estimator.train_lengths,
            fraction=fraction,
            output_dir=WorkDir(config.work_dir).trial(trial.number),
        )
        full_run, own, steps = runs.full_run, runs.trial, runs.full_run_steps
        # A trial saves once at its end only to time the save; once the calibration knows
        # what a save costs, that save is skipped (and said so).
        timed_save = not ctx.estimator.knows_checkpoint_cost()
        if not timed_save and not self._keeps_checkpoint(trial):
            own = dataclasses.replace(own, checkpoint_interval=0, checkpoint_minutes=0.0)
        derived = {
            "effective_batch_size": full_run.effective_batch_size,
            "full_run_steps": steps,
            "full_run_samples": prepared.train_samples * config.full_run.epochs,
            FRACTION_ATTR: fraction,
            "timed_checkpoint_save": timed_save,
        }
        first_run = None if promoted_from is None else _first_run_id(trial.study, promoted_from)
        if first_run is not None:
            # The same configuration, further: its points go on in its first trial's run.
            run_id = ctx.tracker.continue_trial(first_run, trial.number)
        else:
            run_id = ctx.tracker.start_trial(
                ctx.parent_run_id, config.study_name, trial.number, {**params, **derived}
            )
        # The trial's attributes from here to its end, written there in one transaction
        # (each write is a storage transaction of its own; a trial made about a dozen). Only
        # `_run` adds to it, from what the steps it calls return.
        pending: dict[str, Any] = {}
        try:
            return self._run(trial, (full_run, own), params, derived, run_id, pending)
        finally:
            # The run is created in the background; by now its id is there, unless the
            # writer waits for a silent server: then its client-side id (never a stall).
            pending[MLFLOW_RUN_ATTR] = run_id_now(run_id)
            set_user_attrs(trial, pending)

    def _run(
        self,
        trial: optuna.Trial,
        runs: tuple[TrainSpec, TrainSpec],
        params: dict[str, Any],
        derived: dict[str, Any],
        run_id: RunRef,
        pending: dict[str, Any],
    ) -> float | tuple[float, float]:
        """Check the trial's full run and train its own (`runs`: the full run, the trial).

        The trial's configuration goes to the storage with the check's verdict; what comes
        after goes into `pending`, which the caller writes at the trial's end.
        """
        ctx = self.context
        verdict = ctx.estimator.check(trial, *runs, attrs={**params, **derived})
        # A measurement (`hpo.runner`: nothing fits by the calibration) trains regardless.
        if not verdict.feasible and not trial.user_attrs.get(MEASUREMENT_ATTR):
            reason = verdict.reason
            pending.update({STATE_REASON_ATTR: reason, NEVER_TRAINED_ATTR: True})
            self._end(run_id, "pruned", reason, verdict.metrics(), never_trained="true")
            raise optuna.TrialPruned(verdict.reason)

        spec = runs[1]
        # A promoted trial was chosen by its prediction: the pruner does not judge it again.
        reporter = OptunaReporter(
            trial,
            stop_after_steps=spec.stop_after_steps or 1,
            evals=ctx.config.trial.evals,
            prune=trial.user_attrs.get(PROMOTED_FROM_ATTR) is None
            and not ctx.config.multi_objective,
        )
        try:
            result, seconds = self._train(trial, spec, reporter, run_id)
        except TrainingFailed as exc:
            pending[STATE_REASON_ATTR] = str(exc)
            raise
        measured = self._measurements(result, derived["full_run_steps"], seconds)
        honesty, observed = ctx.estimator.observe(runs, result, verdict)
        measured.update(honesty)
        final = self._final_loss(trial, spec, result, derived)
        # The trial's measurements and its curve go with the rest of its attributes.
        pending.update({**observed, **measured, **(final.user_attrs() if final else {})})
        tags: dict[str, str] = {}
        if final is not None:
            pending[ESTIMATE_ATTR] = ctx.estimator.with_final_loss(
                pending.get(ESTIMATE_ATTR), final
            )
            measured.update(final.metrics())
            tags.update(final.tags())

        if reporter.pruned_at is not None:
            reason = f"pruned by {ctx.config.pruner} at step {reporter.pruned_at}"
            pending[STATE_REASON_ATTR] = reason
            self._end(run_id, "pruned", reason, measured, **tags)
            raise optuna.TrialPruned(reason)
        if final is None:
            reason = f"no finite validation loss (got {result.final_eval_loss})"
            pending[STATE_REASON_ATTR] = reason
            self._end(run_id, "failed", reason, measured, **tags)
            raise TrainingFailed(reason)
        value, pending[SCORED_BY_ATTR] = trial_score(
            final,
            objective=ctx.config.objective,
            multi_objective=ctx.config.multi_objective,
            last_rung=bool(rungs := study_rungs(ctx)) and rung_of(trial) == len(rungs),
        )
        band = final.band()
        note = (
            f"complete: predicted final loss {band['p50']:.3g} "
            f"({band['p10']:.3g}-{band['p90']:.3g}) after {final.points[-1][0]} of "
            f"{derived['full_run_samples']:.0f} samples"
        )
        hours = measured.get("predicted_full_run_hours_p50")
        if hours:
            note += f", full run {format_duration(hours * 3600)}"
            note += f" (p90 {format_duration(measured['predicted_full_run_hours_p90'] * 3600)})"
        ctx.tracker.end_trial(
            run_id,
            "complete",
            metrics={"value": value, "val_loss_final": final.last_loss, **measured},
            tags={**tags, NOTE_TAG: note},
        )
        if ctx.config.multi_objective:
            return float(value), self._second_objective(measured)
        return float(value)

    def _final_loss(
        self, trial: optuna.Trial, spec: TrainSpec, result: TrainResult, derived: dict[str, Any]
    ) -> FinalLoss | None:
        """The full run's final loss, the law fitted to this trial with the study's others."""
        curve = trial_curve(
            self._curve_records(trial, result),
            scheduler=spec.scheduler,  # the trial runs its full run's schedule, cut short
            warmup_ratio=spec.warmup_ratio,
            learning_rate=spec.learning_rate,
            full_run_steps=derived["full_run_steps"],
        )
        if curve is None:
            return None
        # The trials the sampler read at this trial's start: no second read of the storage.
        others = trials_snapshot(trial.study)
        return predict_final_loss(
            curve,
            peers=study_peers(
                (t.user_attrs for t in others if t.number != trial.number),
                trial.study.user_attrs,
            ),
            full_run_samples=derived["full_run_samples"],
            correction=self.context.estimator.loss_correction,
            full_run_epochs=self.context.config.full_run.epochs,
        )

    @staticmethod
    def _curve_records(trial: optuna.Trial, result: TrainResult) -> list[dict[str, Any]]:
        """The trial's evaluations; a promotion's go on from those of the trial it resumed.

        A resumed run counts its samples from its own start: they are moved on by the
        samples the trial before it had seen at the step it resumed from.
        """
        source = trial.user_attrs.get(PROMOTED_FROM_ATTR)
        resumed = result.resumed_from_step
        if source is None or resumed is None:
            return list(result.eval_records)
        earlier: list[dict[str, Any]] = []
        for frozen in trial.study.get_trials(deepcopy=False):
            if frozen.number == int(source):
                attr = frozen.user_attrs.get(LAW_CURVE_ATTR) or {}
                points = zip(
                    attr.get("steps", ()), attr.get("samples", ()), attr.get("losses", ()),
                    strict=False,
                )  # fmt: skip
                earlier = [
                    {"step": step, "samples_seen": samples, "loss": loss}
                    for step, samples, loss in points
                    if step <= resumed
                ]
        offset = int(earlier[-1]["samples_seen"]) if earlier else 0
        later = [
            {**r, "samples_seen": int(r.get("samples_seen", 0)) + offset}
            for r in result.eval_records
        ]
        return [*earlier, *later]

    def _second_objective(self, measured: dict[str, float]) -> float:
        """The full run's predicted hours (p50), or their cost at the budget's price."""
        config = self.context.config
        hours = measured.get("predicted_full_run_hours_p50")
        if hours is None:
            raise TrainingFailed("the time model gave no full-run prediction for this trial")
        if config.objectives[1] == "cost":
            return float(hours) * config.budget.price_per_hour
        return float(hours)

    def _keeps_checkpoint(self, trial: optuna.Trial) -> bool:
        """Whether a rung beyond this trial's fraction may continue it from its checkpoint."""
        fraction = self._fraction(trial)
        return any(f > fraction for _, f in study_rungs(self.context))

    def _fraction(self, trial: optuna.Trial) -> float:
        """The trial's share of its full run: its rung's for a promoted trial."""
        config = self.context.config
        if trial.user_attrs.get(PROMOTED_FROM_ATTR) is not None:
            return float(trial.user_attrs.get(FRACTION_ATTR, config.trial.promote_fraction))
        return config.trial.fraction

    def _train(
        self,
        trial: optuna.Trial,
        spec: TrainSpec,
        reporter: OptunaReporter,
        run_id: RunRef,
    ) -> tuple[TrainResult, float]:
        """Train the trial's own short run; a failure ends the trial (bad input: the study).

        Raises:
            TrainingFailed: The run failed; its message is the reason the trial records.
            BadInputError: The run's input is bad: the study stops.
        """
        ctx = self.context
        metrics = TrialMetrics(ctx.tracker, run_id)
        started = time.perf_counter()
        source = trial.user_attrs.get(PROMOTED_FROM_ATTR)
        # A rung continues the trial before it from its checkpoint (same schedule, same
        # data order): it pays only for the data it adds.
        resume = source is not None and _take_checkpoint(
            WorkDir(ctx.config.work_dir).trial(int(source)), Path(spec.output_dir)
        )
        try:
            from trainers.loop.run import train

            try:
                result = train(
                    spec,
                    [
                        reporter,
                        *(ctx.budget.trial_callbacks(trial) if ctx.budget else []),
                        *self._system_metrics(run_id),
                        metrics,
                    ],
                    inputs=self.inputs,
                    resume=resume,
                )
            finally:
                if not self._keeps_checkpoint(trial):
                    _drop_checkpoints(spec.output_dir)
        except BadInputError:
            ctx.tracker.end_trial(run_id, "failed", tags={"reason": "bad input"})
            raise
        except Exception as exc:  # the study goes on: a failed trial, with its reason
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            metrics.flush()
            self._end(run_id, "failed", reason)
            raise TrainingFailed(reason) from exc
        return result, time.perf_counter() - started

    def _system_metrics(self, run_id: RunRef) -> list[TrainingCallback]:
        """CPU/memory/GPU readings on the trial's run, queued on the study's writer.

        They wait in its spool with the trial's other records while the server is away.
        """
        ctx = self.context
        seconds = ctx.config.tracking.system_metrics_seconds
        if seconds <= 0:
            return []
        from trainers.system_metrics import SystemMetrics

        return [SystemMetrics(ctx.tracker.writer, run_id, interval_seconds=seconds)]

    def _end(
        self,
        run_id: RunRef,
        state: str,
        reason: str,
        metrics: dict[str, float] | None = None,
        **tags: str,
    ) -> None:
        """Close the MLflow run of a trial that did not complete, with its reason (the
        caller puts the reason in the trial's pending attributes for Optuna)."""
        note = f"{'pruned before training' if tags.get('never_trained') else state}: {reason}"
        self.context.tracker.end_trial(
            run_id, state, metrics=metrics, tags={"reason": reason, NOTE_TAG: note, **tags}
        )

    @staticmethod
    def _measurements(result: TrainResult, steps: int, seconds: float) -> dict[str, float]:
        median_step = result.median_step_seconds
        return {
            "tokens_per_second": result.tokens_per_second,
            "median_step_seconds": median_step,
            "trial_seconds": seconds,
            # Where the trial's time went: optimizer steps (with their data loading) and
            # evaluations; the rest of `trial_seconds` is set-up, the timed save, teardown.
            "steps_seconds": float(sum(result.step_seconds)),
            "eval_seconds": float(result.timings.get("eval", 0.0)),
            "trained_steps": float(result.optimizer_steps),
            "peak_memory_bytes": float(result.peak_memory_bytes),
            "peak_reserved_bytes": float(result.peak_reserved_bytes),  # CUDA; 0 elsewhere
            "start_memory_bytes": float(result.start_memory_bytes),
            # Not the time model: optimizer steps of the full run x measured median step time.
            "naive_full_run_seconds": steps * median_step,
        }
