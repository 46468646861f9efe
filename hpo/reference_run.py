"""The study's loss-shape reference run: one configuration through a decay of its own.

A trial is the first few percent of its full run, where the learning rate has not begun to
fall: no trial shows the annealing term C * S2 of Tissue et al.'s law ("Scaling Law with
Learning Rate Annealing", arXiv 2408.11029), so C is not identified and every predicted
level misses the decay. Once `REFERENCE_AFTER` trials have finished, the study runs the best
configuration so far once more as a short complete run: `trial.reference_fraction` of its
full run's steps, its scheduler's warm-up and decay over that horizon (`max_steps`), so
its last evaluations lie in the decay. Its curve is stored on the study
(`hpo.final_loss.add_shape_curves`) and joins every later trial's joint fit, where it
carries the shared exponent and C; full runs that report back join the same way.

It is not a trial (Optuna knows nothing of it, the pick never sees it): it is the same
configuration as a trial, with another schedule. It runs in the session's own time, between
two trials, so the search budget's ledger (this session's wall clock) counts it and the
budget's stop sees it. Under a search budget it may take `REFERENCE_BUDGET_SHARE` of it (and
no more than it leaves for trials): its share of the full run is lowered to what that buys,
as the time model prices it, and it is skipped, saying why, where that is under
`MIN_OVER_TRIAL` times a trial's share (it would show no more than a trial). The summary and
the parent MLflow run say what it ran, for how long and what it fitted.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import optuna

from analysis.search.schedule import TrialCost
from common.redact import redact
from common.workdir import WorkDir
from hpo.final_loss import (
    FULL_RUN_SOURCE,
    REFERENCE_KEY,
    TrialCurve,
    add_shape_curves,
    shared_shape,
    study_peers,
    trial_curve,
)
from hpo.full_run_reports import same_data
from hpo.keys import REFERENCE_ATTR
from hpo.states import FINISHED_STATES, trial_loss
from hpo.trial_runs import full_run, on_one_gpu
from trainers.spec import TrainSpec, full_run_steps

if TYPE_CHECKING:
    from analysis.calibration.full_runs import FullRun
    from hpo.objective import StudyContext

log = logging.getLogger(__name__)

REFERENCE_AFTER = 3  # finished trials before the reference run (its pick needs a few)
_EVALS_PER_TRIAL_EVALS = 2  # the reference evaluates twice as often as a trial: the decay
# Under a search budget: the most of it the reference may take. Three 120 s studies whose
# reference took 14-38 % of the budget finished 2 trials each (benchmarks/hpo_efficiency.py).
REFERENCE_BUDGET_SHARE = 0.15
MIN_OVER_TRIAL = 2.0  # a reference shorter than twice a trial shows no more than a trial


@dataclasses.dataclass(frozen=True)
class ReferenceSize:
    """The share of its full run the reference trains, or why it is not run (`fraction` 0)."""

    fraction: float
    reason: str = ""


def reference_size(
    wanted: float,
    *,
    trial_fidelity: float,
    budget_seconds: float | None,
    left_seconds: float,
    cost: TrialCost | None,
    typical_trial_seconds: float,
) -> ReferenceSize:
    """`wanted` (the study's `reference_fraction`), lowered to what the search budget buys.

    The reference may cost `REFERENCE_BUDGET_SHARE` of the budget and at most half of what is
    left. It is priced as a trial at its fidelity with twice the evaluations (`cost`: the
    time model's, refitted on the trials), or, without that, as typical trials scaled by
    fidelity.
    """
    if budget_seconds is None:
        return ReferenceSize(wanted)
    room = min(REFERENCE_BUDGET_SHARE * budget_seconds, 0.5 * max(left_seconds, 0.0))
    if cost is not None and cost.per_fidelity > 0:
        affordable = (room - _EVALS_PER_TRIAL_EVALS * cost.fixed) / cost.per_fidelity
    else:
        affordable = room / max(typical_trial_seconds, 1e-9) * trial_fidelity
    fraction = min(wanted, affordable)
    if fraction < MIN_OVER_TRIAL * trial_fidelity:
        return ReferenceSize(
            0.0,
            f"skipped: {REFERENCE_BUDGET_SHARE:.0%} of the search budget "
            f"({room:.0f} s of {budget_seconds:.0f} s) buys {max(affordable, 0.0):.3g} of the "
            f"full run, under {MIN_OVER_TRIAL:g}x a trial's {trial_fidelity:.3g}",
        )
    return ReferenceSize(fraction)


def reference_spec(
    full_run: TrainSpec, full_steps: int, *, fraction: float, evals: int
) -> TrainSpec:
    """`full_run` as a complete run of `fraction` of its `full_steps` optimizer steps.

    The scheduler's horizon is the reference's own length (`max_steps`), so the rate warms
    up and decays to its end inside it; it evaluates about `evals` times, evenly spaced, and
    saves no checkpoint.
    """
    steps = min(full_steps, max(2, round(fraction * full_steps)))
    return dataclasses.replace(
        on_one_gpu(full_run),  # it trains where the trials do
        max_steps=steps,
        stop_after_steps=None,
        eval_interval=max(1, steps // evals),
        checkpoint_interval=0,
    )


def reference_curve(spec: TrainSpec, result: Any) -> TrialCurve | None:
    """The reference run's evaluations on its own schedule (its last loss included)."""
    records = list(result.eval_records)
    if result.final_eval_loss is not None and result.final_step:
        records.append({"step": result.final_step, "loss": result.final_eval_loss})
    assert spec.max_steps is not None
    return trial_curve(
        records,
        scheduler=spec.scheduler,
        warmup_ratio=spec.warmup_ratio,
        learning_rate=spec.learning_rate,
        full_run_steps=spec.max_steps,
    )


class ReferenceRun:
    """Optuna callback: after `REFERENCE_AFTER` finished trials, run the reference once."""

    def __init__(self, context: StudyContext) -> None:
        self.context = context

    def __call__(self, study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        fraction = self.context.config.trial.reference_fraction
        budget = self.context.budget
        if fraction <= 0 or REFERENCE_ATTR in study.user_attrs or (budget and budget.stopped):
            return
        best = _best_so_far(study, self.context.config.n_trials)
        if best is None:
            return
        size = self._size(fraction)
        if not size.fraction:
            record = {"trial": best.number, "state": "skipped", "reason": size.reason}
            study.set_user_attr(REFERENCE_ATTR, record)
            self._track(record)
            return
        fraction = size.fraction
        study.set_user_attr(REFERENCE_ATTR, {"trial": best.number, "state": "running"})
        try:
            record = self._run(study, best, fraction)
        except Exception as exc:  # the study goes on without it: trials fall back as before
            log.warning("the loss-shape reference run failed: %s", redact(str(exc)))
            record = {"trial": best.number, "state": "failed", "reason": redact(str(exc))[:300]}
        study.set_user_attr(REFERENCE_ATTR, record)
        self._track(record)

    def _size(self, wanted: float) -> ReferenceSize:
        budget = self.context.budget
        if budget is None or budget.budget_seconds is None:
            return ReferenceSize(wanted)
        return reference_size(
            wanted,
            trial_fidelity=budget.plan.fidelity,
            budget_seconds=budget.budget_seconds,
            left_seconds=(budget.usable_seconds or 0.0) - budget.spent(),
            cost=budget.cost,
            typical_trial_seconds=budget.typical_trial_seconds(),
        )

    def _run(
        self, study: optuna.Study, best: optuna.trial.FrozenTrial, fraction: float
    ) -> dict[str, Any]:
        from trainers.loop.run import train

        ctx = self.context
        config, prepared = ctx.config, ctx.prepared
        output = (
            WorkDir(config.work_dir).trial(best.number).with_name(f"reference-{best.number:03d}")
        )
        # A trial's user attributes hold its sampled configuration.
        full = full_run(
            config, best.user_attrs, model=prepared.model_path, data=prepared.data_path,
            output_dir=str(output),
        )  # fmt: skip
        steps = full_run_steps(full, ctx.estimator.train_lengths(full.max_length))
        spec = reference_spec(
            full, steps, fraction=fraction, evals=_EVALS_PER_TRIAL_EVALS * config.trial.evals
        )
        started = time.perf_counter()
        try:
            result = train(spec)
        finally:
            shutil.rmtree(output, ignore_errors=True)  # nothing of it is kept but its curve
        seconds = time.perf_counter() - started
        curve = reference_curve(spec, result)
        if curve is None:
            raise ValueError(f"no finite validation loss (got {result.final_eval_loss})")
        add_shape_curves(study, {REFERENCE_KEY: curve.to_attr()})
        trials = study.get_trials(deepcopy=False)
        curves = study_peers((t.user_attrs for t in trials), study.user_attrs)
        return {
            "trial": best.number, "state": "complete", "fraction": fraction,
            "steps": spec.max_steps, "seconds": seconds, "final_loss": curve.losses[-1],
            **shared_shape(curves),
        }  # fmt: skip

    def _track(self, record: dict[str, Any]) -> None:
        """The reference run on the parent MLflow run: params once, its outcome as a tag."""
        ctx = self.context
        params = {f"reference_run.{k}": v for k, v in record.items() if v is not None}
        ctx.tracker.writer.log_batch(
            ctx.parent_run_id, params=params, tags={"reference_run": reference_line(record)}
        )


def _best_so_far(study: optuna.Study, n_trials: int) -> optuna.trial.FrozenTrial | None:
    """The best complete trial once `REFERENCE_AFTER` trials finished, else None."""
    trials = study.get_trials(deepcopy=False)
    finished = sum(t.state in FINISHED_STATES for t in trials)
    if not REFERENCE_AFTER <= finished < n_trials:  # none left to learn from it: not run
        return None
    scored = [
        (loss, t.number, t)
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE and (loss := trial_loss(t)) is not None
    ]
    return min(scored, key=lambda item: item[:2])[2] if scored else None


def add_full_run_curves(
    study: optuna.Study, runs: Sequence[FullRun], data_path: str | None = None
) -> int:
    """Store the whole curves of `study`'s finished full runs with its shape curves; a run
    trained on other data than `data_path` (the study's) is left out.

    Returns:
        How many curves were stored.
    """
    curves = {
        f"{FULL_RUN_SOURCE}{run.run_id}": curve
        for run in runs
        if (run.report.get("provenance") or {}).get("study") == study.study_name
        and same_data((run.report.get("spec") or {}).get("data"), data_path)
        and (curve := run.shape_curve()) is not None
        and TrialCurve.from_attr(curve) is not None
    }
    add_shape_curves(study, curves)
    return len(curves)


def reference_line(record: dict[str, Any] | None) -> str:
    """One line on the reference run for the summary ("" when the study ran none)."""
    if not record:
        return ""
    if record.get("state") != "complete":
        reason = record.get("reason") or record.get("state")
        return f"loss-shape reference run: trial {record.get('trial')}'s configuration, {reason}"
    return (
        f"loss-shape reference run: trial {record['trial']}'s configuration to "
        f"{record['fraction']:.3g} of its full run ({record['steps']} steps, own decay) in "
        f"{record['seconds']:.0f} s; fitted alpha {record['alpha']:.3g}, "
        f"annealing C {record['annealing']:.3g} from {record['curves']} curves"
    )
