"""One trial: sample -> plan -> (feasible?) -> short training -> value, tracked in MLflow."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from common.errors import BadInputError, TrainingFailed
from hpo.tracking import RunRef, Tracker, TrialMetrics
from search_spaces import SearchSpace, sample
from trainers.events import EvalInfo, TrainingCallback
from trainers.result import TrainResult
from trainers.spec import LoraSpec, TrainSpec

log = logging.getLogger(__name__)


@dataclass
class StudyContext:
    """What every trial of one study shares."""

    config: Any  # hpo.config.StudyConfig
    space: SearchSpace
    model_path: str
    data_path: str
    train_samples: int
    tracker: Tracker
    parent_run_id: str
    estimator: Any = None  # hpo.estimator.StudyEstimator, when the time model is on
    extra_callbacks: list[TrainingCallback] = field(default_factory=list)


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


def spec_for(
    context: StudyContext, params: dict[str, Any], *, full_run: bool, output_dir: str
) -> TrainSpec:
    """The training a configuration becomes: a short trial, or the full run of the preset."""
    config = context.config
    lora = LoraSpec(
        r=int(params["lora_r"]),
        alpha=float(params["lora_alpha"]),
        dropout=float(params["lora_dropout"]),
    )
    return TrainSpec(
        model=context.model_path,
        data=context.data_path,
        output_dir=output_dir,
        lora=lora,
        micro_batch_size=int(params["micro_batch_size"]),
        gradient_accumulation_steps=int(params["gradient_accumulation_steps"]),
        learning_rate=float(params["learning_rate"]),
        weight_decay=float(params.get("weight_decay", 0.0)),
        warmup_ratio=float(params.get("warmup_ratio", 0.0)),
        max_length=int(params["max_length"]),
        gradient_checkpointing=bool(params["gradient_checkpointing"]),
        max_steps=None if full_run else config.trial_max_steps,
        epochs=config.epochs,
        eval_interval=config.full_eval_interval if full_run else config.eval_interval,
        eval_samples=config.eval_samples,
        checkpoint_interval=config.full_checkpoint_interval if full_run else 0,
        validation_fraction=config.validation_fraction,
        device=config.device,
        precision=config.precision,
        seed=config.seed,
        cache_dir=str(Path(config.work_dir).resolve() / "cache"),
    )


def full_run_steps(
    train_samples: int, micro_batch_size: int, accumulation: int, epochs: float
) -> int:
    """Optimizer steps of the full run, counted the way transformers' Trainer counts them."""
    batches = math.ceil(train_samples / micro_batch_size)
    per_epoch = max(1, math.ceil(batches / accumulation))
    return max(1, math.ceil(per_epoch * epochs))


class Objective:
    """Callable handed to `study.optimize`."""

    def __init__(self, context: StudyContext) -> None:
        self.context = context

    def __call__(self, trial: optuna.Trial) -> float:
        ctx = self.context
        config = ctx.config
        params = sample(trial, ctx.space, config.profiles)
        derived = {
            "effective_batch_size": params["micro_batch_size"]
            * params["gradient_accumulation_steps"],
            "full_run_steps": full_run_steps(
                ctx.train_samples,
                params["micro_batch_size"],
                params["gradient_accumulation_steps"],
                config.epochs,
            ),
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
        config = ctx.config

        verdict = ctx.estimator.check(trial, params, derived) if ctx.estimator else None
        if verdict is not None and not verdict.feasible:
            trial.set_user_attr("state_reason", verdict.reason)
            ctx.tracker.end_trial(
                run_id,
                "pruned",
                metrics=verdict.metrics(),
                tags={"reason": verdict.reason, "never_trained": "true"},
            )
            raise optuna.TrialPruned(verdict.reason)

        reporter = OptunaReporter(trial)
        metrics = TrialMetrics(ctx.tracker, run_id)
        spec = spec_for(
            ctx,
            params,
            full_run=False,
            output_dir=str(Path(config.work_dir) / "trials" / f"trial-{trial.number:03d}"),
        )
        started = time.perf_counter()
        try:
            from trainers.loop.run import train

            result = train(spec, [reporter, metrics, *ctx.extra_callbacks])
        except BadInputError:
            ctx.tracker.end_trial(run_id, "failed", tags={"reason": "bad input"})
            raise
        except Exception as exc:  # the study goes on: a failed trial, with its reason
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            metrics.flush()
            trial.set_user_attr("state_reason", reason)
            ctx.tracker.end_trial(run_id, "failed", tags={"reason": reason})
            raise TrainingFailed(reason) from exc

        measured = self._measurements(
            result, derived["full_run_steps"], time.perf_counter() - started
        )
        if verdict is not None:
            measured.update(ctx.estimator.observe(trial, params, result, verdict))
        for key, value in measured.items():
            trial.set_user_attr(key, value)

        if reporter.pruned_at is not None:
            reason = f"pruned by {config.pruner} at step {reporter.pruned_at}"
            trial.set_user_attr("state_reason", reason)
            ctx.tracker.end_trial(run_id, "pruned", metrics=measured, tags={"reason": reason})
            raise optuna.TrialPruned(reason)

        final_loss = result.final_eval_loss
        if final_loss is None or not math.isfinite(final_loss):
            reason = f"no finite validation loss (got {final_loss})"
            trial.set_user_attr("state_reason", reason)
            ctx.tracker.end_trial(run_id, "failed", metrics=measured, tags={"reason": reason})
            raise TrainingFailed(reason)
        ctx.tracker.end_trial(
            run_id, "complete", metrics={"value": final_loss, "val_loss_final": final_loss, **measured}
        )
        return float(final_loss)

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
