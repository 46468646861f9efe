"""One trial: sample -> plan -> (feasible?) -> short training -> value, tracked in MLflow."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from common.errors import BadInputError, TrainingFailed
from hpo.config import StudyConfig
from hpo.estimator import StudyEstimator
from hpo.runspec import train_spec
from hpo.tracking import RunRef, Tracker, TrialMetrics
from search_spaces import SearchSpace, sample
from trainers.events import EvalInfo, TrainingCallback
from trainers.result import TrainResult
from trainers.spec import optimizer_steps


@dataclass
class StudyContext:
    """What every trial of one study shares."""

    config: StudyConfig
    space: SearchSpace
    model_path: str
    data_path: str
    train_samples: int
    tracker: Tracker
    parent_run_id: str
    estimator: StudyEstimator


class OptunaReporter(TrainingCallback):
    """Reports each validation loss to the pruner; asks the run to stop when pruned."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.pruned_at: int | None = None

    def on_eval(self, info: EvalInfo) -> bool:
        self.trial.report(info.loss, info.step)
        if self.trial.should_prune():
            self.pruned_at = info.step
            return True
        return False


class Objective:
    """Callable handed to `study.optimize`."""

    def __init__(self, context: StudyContext) -> None:
        self.context = context

    def __call__(self, trial: optuna.Trial) -> float:
        ctx = self.context
        config = ctx.config
        params = sample(trial, ctx.space, config.profiles)
        full_run = train_spec(
            config, params, model=ctx.model_path, data=ctx.data_path, full_run=True
        )
        derived = {
            "effective_batch_size": full_run.effective_batch_size,
            "full_run_steps": optimizer_steps(full_run, ctx.train_samples),
        }
        for key, value in {**params, **derived}.items():
            trial.set_user_attr(key, value)
        run_id = ctx.tracker.start_trial(
            ctx.parent_run_id, config.study_name, trial.number, {**params, **derived}
        )
        try:
            return self._run(trial, params, derived, run_id)
        finally:
            # The run is created in the background; by now its id is there.
            trial.set_user_attr("mlflow_run_id", run_id.result())

    def _run(
        self,
        trial: optuna.Trial,
        params: dict[str, Any],
        derived: dict[str, Any],
        run_id: RunRef,
    ) -> float:
        ctx = self.context
        verdict = ctx.estimator.check(trial, params)
        if not verdict.feasible:
            reason = verdict.reason
            self._end(trial, run_id, "pruned", reason, verdict.metrics(), never_trained="true")
            raise optuna.TrialPruned(verdict.reason)

        reporter = OptunaReporter(trial)
        result, seconds = self._train(trial, params, reporter, run_id)
        measured = self._measurements(result, derived["full_run_steps"], seconds)
        measured.update(ctx.estimator.observe(trial, params, result, verdict))
        for key, value in measured.items():
            trial.set_user_attr(key, value)

        if reporter.pruned_at is not None:
            reason = f"pruned by {ctx.config.pruner} at step {reporter.pruned_at}"
            self._end(trial, run_id, "pruned", reason, measured)
            raise optuna.TrialPruned(reason)
        final_loss = result.final_eval_loss
        if final_loss is None or not math.isfinite(final_loss):
            reason = f"no finite validation loss (got {final_loss})"
            self._end(trial, run_id, "failed", reason, measured)
            raise TrainingFailed(reason)
        ctx.tracker.end_trial(
            run_id,
            "complete",
            metrics={"value": final_loss, "val_loss_final": final_loss, **measured},
        )
        return float(final_loss)

    def _train(
        self,
        trial: optuna.Trial,
        params: dict[str, Any],
        reporter: OptunaReporter,
        run_id: RunRef,
    ) -> tuple[TrainResult, float]:
        """Train the trial's own short run; a failure ends the trial (bad input: the study)."""
        ctx = self.context
        output_dir = Path(ctx.config.work_dir) / "trials" / f"trial-{trial.number:03d}"
        spec = train_spec(
            ctx.config,
            params,
            model=ctx.model_path,
            data=ctx.data_path,
            full_run=False,
            output_dir=str(output_dir),
        )
        metrics = TrialMetrics(ctx.tracker, run_id)
        started = time.perf_counter()
        try:
            from trainers.loop.run import train

            result = train(spec, [reporter, metrics])
        except BadInputError:
            ctx.tracker.end_trial(run_id, "failed", tags={"reason": "bad input"})
            raise
        except Exception as exc:  # the study goes on: a failed trial, with its reason
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            metrics.flush()
            self._end(trial, run_id, "failed", reason)
            raise TrainingFailed(reason) from exc
        return result, time.perf_counter() - started

    def _end(
        self,
        trial: optuna.Trial,
        run_id: RunRef,
        state: str,
        reason: str,
        metrics: dict[str, float] | None = None,
        **tags: str,
    ) -> None:
        """Close a trial that did not complete: its reason in Optuna and in MLflow."""
        trial.set_user_attr("state_reason", reason)
        self.context.tracker.end_trial(
            run_id, state, metrics=metrics, tags={"reason": reason, **tags}
        )

    @staticmethod
    def _measurements(result: TrainResult, steps: int, seconds: float) -> dict[str, float]:
        median_step = result.median_step_seconds
        return {
            "tokens_per_second": result.tokens_per_second,
            "median_step_seconds": median_step,
            "trial_seconds": seconds,
            "trained_steps": float(result.optimizer_steps),
            "peak_memory_bytes": float(result.peak_memory_bytes),
            # Not the time model: optimizer steps of the full run x measured median step time.
            "naive_full_run_seconds": steps * median_step,
        }
