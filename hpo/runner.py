"""The study loop: prepare once, then hand trials to Optuna. Kept apart from the CLI."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from common.errors import BadInputError, TrainingFailed
from common.redact import redact
from common.workdir import WorkDir
from hpo import search_budget
from hpo.config import StudyConfig
from hpo.estimator import StudyEstimator
from hpo.feasible_sampler import redraw_infeasible
from hpo.final_loss import curve_run_ids
from hpo.full_run_reports import (
    full_run_results,
    measured_by_trial,
    record,
    record_trl,
    trl_run_results,
)
from hpo.keys import (
    CONFIG_ATTR,
    DATA_ATTR,
    EXPORTED_ATTR,
    FRACTION_ATTR,
    MEASUREMENT_ATTR,
    MODEL_ATTR,
    NEVER_TRAINED_ATTR,
    PROMOTED_FROM_ATTR,
    RUNG_ATTR,
    SEARCH_ATTR,
    STATE_REASON_ATTR,
)
from hpo.objective import Objective, StudyContext, drop_trial_checkpoints, study_rungs
from hpo.pick import rung_candidates
from hpo.prepare import Prepared, prepare
from hpo.pruners import make_pruner
from hpo.reference_run import ReferenceRun, add_full_run_curves
from hpo.samplers import make_sampler
from hpo.states import FINISHED_STATES
from hpo.storage import has_heartbeats, make_storage
from hpo.study_progress import StudyProgress
from hpo.study_space import check_same_space, space_record
from hpo.summary import StudySummary, parent_note, summarize
from hpo.tracking import Tracker
from hpo.what_fits import Proposals, check_space, feasible_starts
from hpo.workers import WORKER_INDEX_ENV, claimed, fail_dead_workers_trials

log = logging.getLogger(__name__)

# On the study's parent MLflow run: the trial its preset was written for and the rule that
# picked it (`hpo.pick.pick_trial`); its `best_trial` tag is the best score so far.
EXPORTED_TRIAL_TAG, PICKED_BY_TAG = "exported_trial", "picked_by"


def open_study(config: StudyConfig, prepared: Prepared) -> optuna.Study:
    storage = make_storage(
        config.storage_url,
        heartbeat_seconds=config.heartbeat_seconds,
        grace_seconds=config.grace_seconds,
    )
    # Optuna cannot prune on learning curves in a multi-objective study (a trial may not
    # report intermediate values there); the window and memory gate trials as before.
    pruner = "none" if config.multi_objective else config.pruner
    if config.multi_objective and config.pruner != "none":
        log.info(
            "objectives %s: trials are not pruned by %s", list(config.objectives), config.pruner
        )
    study = optuna.create_study(
        study_name=config.study_name,
        storage=storage,
        sampler=make_sampler(config.sampler, seed=config.seed),
        pruner=make_pruner(pruner, evals=config.trial.evals),
        directions=["minimize"] * len(config.objectives),
        load_if_exists=True,
    )
    # Optuna loads an existing study whatever directions were asked for.
    before = (study.user_attrs.get(CONFIG_ATTR) or {}).get("objectives") or ["loss"]
    if len(study.directions) != len(config.objectives) or (
        CONFIG_ATTR in study.user_attrs and list(before) != list(config.objectives)
    ):
        raise BadInputError(
            f"study '{config.study_name}' was created with objectives {list(before)}, not "
            f"{list(config.objectives)}; use another --study-name"
        )
    check_same_space(study, space_record(prepared.space, config.profiles))
    # Workers that start a new study together each write its attributes, one write at a
    # time: the config last, so that a worker seeing it sees the model too; a model still
    # missing beside it (a start that stopped between writes) is written, not refused.
    attrs = study.user_attrs
    held = attrs.get(MODEL_ATTR)
    if CONFIG_ATTR not in attrs or held is None:
        study.set_user_attr(MODEL_ATTR, prepared.model_path)
        study.set_user_attr(DATA_ATTR, prepared.data_path)
        if CONFIG_ATTR not in attrs:
            study.set_user_attr(CONFIG_ATTR, config.to_dict())
    elif held != prepared.model_path:
        raise BadInputError(
            f"study '{config.study_name}' was started on model {held}; "
            f"use another --study-name for {prepared.model_path}"
        )
    return study


EstimatorFactory = Callable[[StudyConfig, Prepared], StudyEstimator]


def run_study(
    config: StudyConfig,
    *,
    progress: bool = True,
    estimator_factory: EstimatorFactory = StudyEstimator,
    since_launch: float = 0.0,
    after_workers: bool = False,
) -> StudySummary:
    """Run (or continue) the study described by `config` until it holds `n_trials` trials.

    Args:
        config: The study.
        progress: Show a progress bar.
        estimator_factory: Builds the study's time model (tests pin its coefficients).
        since_launch: Seconds this process ran before the call (its imports): search time.
        after_workers: The summary of `--workers N` once its workers are done (the limit that
            ended the study is theirs).

    Raises:
        BadInputError: Bad input, or nothing in the space fits the budget; either stops
            before a study or an MLflow run is written.
    """
    started = time.perf_counter() - since_launch
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    config, prepared, estimator, study = _open(config, estimator_factory)
    tracker = Tracker.for_study(config)
    parent = tracker.ensure_parent(study, _flat(config.to_dict()))
    _log_data_input(tracker, parent, prepared, config.validation_split, config.data_columns)
    if not has_heartbeats(config.storage_url) and fail_dead_workers_trials(study):
        tracker.reconcile(parent, study)  # their MLflow runs: FAILED, state=failed
    _learn_from_full_runs(tracker, estimator, study)
    for cut in prepared.cuts:  # what the study trains on: the samples whole, or cut where
        print(cut.line(prepared), flush=True)
    # Set-up and any probe (no calibration yet, or measuring before refusing) are search time.
    keeper, config = search_budget.start(
        study,
        config,
        estimator,
        before_trials_seconds=time.perf_counter() - started,
        launched=started,
    )
    keeper.after_workers = after_workers
    # The trials' fraction is the plan's: the estimator judges runs of the config it runs.
    estimator = estimator.for_config(config)
    search_budget.record_plan(tracker, parent, keeper)
    context = StudyContext(config, prepared, tracker, parent, estimator, keeper)
    _optimize(study, context, progress=progress)
    # A worker `--workers N` started leaves the promotions to its launcher, which promotes
    # once when all have ended: workers ending one by one would each promote the best they saw.
    started_by_launcher = os.environ.get(WORKER_INDEX_ENV) is not None
    # Under a budget the plan kept their time for them.
    if not started_by_launcher and (not keeper.stopped or keeper.plan.promote):
        keeper.promoting = True
        promote(study, context, progress=progress)
    if keeper.trials_ended is None:  # no trial ran in this session
        keeper.trials_ended = time.perf_counter()
    summary = _close(study, context)
    summary.elapsed_seconds = time.perf_counter() - started
    return summary


def _open(
    config: StudyConfig, estimator_factory: EstimatorFactory
) -> tuple[StudyConfig, Prepared, StudyEstimator, optuna.Study]:
    """Prepare the model and data, check the space, and open the study (nothing written
    before the check). The config comes back with the study's one validation length."""
    prepared = prepare(config)
    # The study's one validation length and its training length: given, or the data's p99.
    config = dataclasses.replace(
        config, eval_max_length=prepared.eval_max_length, max_length=prepared.max_length
    )
    estimator = estimator_factory(config, prepared)
    prepared = estimator.prepared  # its space: what this machine lets the search propose
    check_space(estimator)  # before anything is written: nothing fits -> exit 2
    study = open_study(config, prepared)
    stored = (study.user_attrs.get(CONFIG_ATTR) or {}).get("eval_max_length")
    if stored and stored != config.eval_max_length:
        # A resumed study keeps the validation length its first trials were scored at.
        config = dataclasses.replace(config, eval_max_length=int(stored))
        estimator = estimator_factory(config, prepared)
    return config, prepared, estimator, study


def _close(study: optuna.Study, context: StudyContext) -> StudySummary:
    """Close the trials' runs, export the best, record what the search spent, write the
    report and close the parent run (waiting a while for a server that does not answer)."""
    config, tracker, parent = context.config, context.tracker, context.parent_run_id
    tracker.reconcile(parent, study)
    tracker.update_parent(parent, study)
    summary = summarize(study, config, tracker, parent)
    if context.budget is not None:
        finished = len(study.get_trials(deepcopy=False, states=FINISHED_STATES))
        summary.search = context.budget.report(context.budget.ended_by(finished, config.n_trials))
    search_budget.record_spent(tracker, parent, summary.search)

    study.set_user_attr(SEARCH_ATTR, summary.search)  # the report's line on it
    _report(study, config, tracker, summary)

    def spent_to_the_end() -> None:
        # Launch to exit, the close included: the summary's, the parent run's and the report's.
        if context.budget is None:
            return
        before = dict(summary.search)
        summary.search = context.budget.finish(summary.search)
        search_budget.record_spent(tracker, parent, summary.search)
        study.set_user_attr(SEARCH_ATTR, summary.search)
        if summary.report_path:
            search_budget.rewrite_report_line(
                tracker, parent, Path(summary.report_path), before, summary.search
            )

    summary.tracking_records_waiting = tracker.finish_parent(
        parent, exit_wait_seconds=config.tracking.exit_wait_seconds, last=spent_to_the_end
    )
    summary.tracking_spool = tracker.spool_folder
    return summary


def _log_data_input(
    tracker: Tracker,
    parent: str,
    prepared: Prepared,
    validation_split: str | None,
    data_columns: str | None,
) -> None:
    """The study's data as the parent run's MLflow dataset inputs (spooled like any record):
    the data, or its train split and the split it validates on."""
    from trainers.data.lineage import dataset_inputs

    stats = next(iter(prepared.dataset_stats.values()))
    for dataset, context in dataset_inputs(
        prepared.data_path, shape=stats.shape, rows=stats.records,
        validation_split=validation_split, validation_rows=stats.validation_records,
        columns=data_columns,
    ):  # fmt: skip
        tracker.writer.log_input(parent, dataset, context)


def _optimize(study: optuna.Study, context: StudyContext, *, progress: bool) -> None:
    """Hand trials to Optuna until the study holds `n_trials` finished ones."""
    config, tracker, parent = context.config, context.tracker, context.parent_run_id
    done = len(study.get_trials(deepcopy=False, states=FINISHED_STATES))
    remaining = max(0, config.n_trials - done)
    if not study.get_trials(deepcopy=False):  # a new study: start where configurations fit
        allowed = tuple(config.profiles or context.prepared.space.profile_names)
        starts = feasible_starts(context.estimator, allowed, seed=config.seed)
        for params in starts:
            study.enqueue_trial(params, skip_if_exists=True)
        if starts:
            log.info(
                "under half the space fits the window: starting with %d configurations that "
                "fit (%s)",
                len(starts),
                "; ".join(", ".join(f"{k} {v}" for k, v in p.items()) for p in starts),
            )
    proposals = _judge_proposals(study, context)
    bar = StudyProgress(config.n_trials, done, enabled=progress)

    def update_parent(study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        tracker.update_parent(parent, study)

    keeper = context.budget
    # The reference run before the budget's check: the check then counts its time.
    callbacks: list[Any] = [
        ReferenceRun(context),
        _when_nothing_fits(proposals, context),
        *([keeper.after_trial] if keeper else []),
    ]
    try:
        if remaining and (keeper is None or keeper.before_start()):
            study.optimize(
                claimed(Objective(context)),
                n_trials=remaining,
                timeout=config.timeout,
                catch=(TrainingFailed,),
                callbacks=[
                    optuna.study.MaxTrialsCallback(config.n_trials, states=FINISHED_STATES),
                    update_parent,
                    bar,
                    *callbacks,
                ],
                # No full collection after every trial: before the first trained trial
                # freezes the long-lived objects (RunInputs) one walks the whole heap (torch,
                # transformers: ~0.1 s), and a study that refuses most of what TPE proposes
                # spent most of its budget there. A run's garbage is collected where it
                # matters, before the next run allocates (the Trainer's start collects).
                gc_after_trial=False,
            )
    finally:
        bar.close()
        tracker.flush()


def _judge_proposals(study: optuna.Study, context: StudyContext) -> Proposals:
    """TPE's joint proposals whose full run would not fit are drawn again, then repaired,
    before a trial starts (`hpo.feasible_sampler`), judged as the trial's own check would."""
    allowed = tuple(context.config.profiles or context.prepared.space.profile_names)
    proposals = Proposals(context.estimator, allowed)
    redraw_infeasible(study, proposals.fits, proposals.repair)
    return proposals


# When nothing fits by the study's calibration, the fastest configuration is trained as a
# measurement this many times per session before the study stops (see below).
MEASUREMENTS_WHEN_NOTHING_FITS = 3


def _when_nothing_fits(
    proposals: Proposals, context: StudyContext
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """After a refused trial, when no configuration fits by the calibration the study's
    trials have made: measure, then stop.

    A refusal measures nothing, so that calibration would stand and every later proposal be
    refused. It may be wrong: a calibration from a few short trials carries a wide band (on
    the 2-vCPU VM, x1.3 at p90 against the probe's x1.08) and moves with each trial. So the
    fastest configuration (lowest p90) is trained as a measurement (trial attribute
    `measurement`, trained though its check says it does not fit; the pick passes over it
    while a trial that fits remains), up to `MEASUREMENTS_WHEN_NOTHING_FITS` times; if
    still nothing fits, the study stops: the rest of the budget would buy only refusals.
    """
    measured = 0

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        nonlocal measured
        if not trial.user_attrs.get(NEVER_TRAINED_ATTR) or not proposals.nothing_fits():
            return
        source = context.estimator.coefficients.source
        if measured < MEASUREMENTS_WHEN_NOTHING_FITS:
            measured += 1
            params, verdict = proposals.fastest()
            log.warning(
                "by the time model calibrated on this study's trials (%s) no configuration's "
                "full run fits the window (the fastest is %s): training it as measurement "
                "%d of %d to narrow that model",
                source,
                verdict.reason,
                measured,
                MEASUREMENTS_WHEN_NOTHING_FITS,
            )
            study.enqueue_trial(params, user_attrs={MEASUREMENT_ATTR: True})
            return
        log.warning(
            "stopping: by the time model calibrated on this study's trials (%s) no "
            "configuration's full run fits the window, after %d measurements (trial %d: %s); "
            "the best trial so far is exported. A longer window, fewer epochs or a faster "
            "profile would fit more",
            source,
            measured,
            trial.number,
            trial.user_attrs.get(STATE_REASON_ATTR, "refused"),
        )
        if context.budget is not None:
            context.budget.nothing_fits = True
        study.stop()

    return callback


def promote(study: optuna.Study, context: StudyContext, *, progress: bool) -> int:
    """Successive halving in data fraction: each rung (`config.trial.promotions`, K@F)
    continues the K best configurations of the rung before to F of their full runs.

    Each becomes a new trial of the same configuration (Optuna cannot reopen a finished
    trial) that records `promoted_from` (the trial of the rung before) and `trial_fraction`,
    resumes from that trial's checkpoint, continues its MLflow run and, once complete,
    stands for the configuration in the export. One whose full run reported back
    (`hpo.full_run_reports`) is not promoted: the next best is. A configuration is promoted once
    per rung: running the study again adds no duplicates, and of a promotion two workers
    queued at once only the first trains (`hpo.objective.promoted_before`). The trials'
    checkpoints go once the rungs are over.

    Returns:
        How many trials were promoted now.
    """
    rungs = study_rungs(context)
    promoted = 0
    try:
        for depth, (keep, fraction) in enumerate(rungs, start=1):
            promoted += _promote_rung(study, context, depth, keep, fraction, progress=progress)
    finally:
        drop_trial_checkpoints(study, context.config)
    return promoted


def _promote_rung(
    study: optuna.Study,
    context: StudyContext,
    depth: int,
    keep: int,
    fraction: float,
    *,
    progress: bool,
) -> int:
    """Queue and train rung `depth`: the `keep` best complete trials of the rung before."""
    # A full run measured it: nothing to promote.
    ran = measured_by_trial(study.user_attrs)
    chosen = rung_candidates(study.get_trials(deepcopy=False), depth, keep, ran)
    for trial in chosen:
        study.enqueue_trial(
            trial.params,
            user_attrs={PROMOTED_FROM_ATTR: trial.number, RUNG_ATTR: depth, FRACTION_ATTR: fraction},
        )
    if not chosen:
        return 0
    log.info(
        "rung %d: continuing trials %s to %.0f %% of their full runs",
        depth,
        ", ".join(str(t.number) for t in chosen),
        100 * fraction,
    )
    bar = StudyProgress(len(chosen), 0, enabled=progress)
    try:
        study.optimize(
            claimed(Objective(context)),
            n_trials=len(chosen),
            catch=(TrainingFailed,),
            callbacks=[bar, *([context.budget.record] if context.budget else [])],
            gc_after_trial=False,  # as in `_optimize`
        )
    finally:
        bar.close()
        context.tracker.flush()
    return len(chosen)


def _report(
    study: optuna.Study, config: StudyConfig, tracker: Tracker, summary: StudySummary
) -> None:
    """The study's report: files in the work dir, artifacts and a note on the parent run.

    A report that cannot be drawn costs the study nothing but a warning.
    """
    parent = summary.mlflow_parent_run_id
    tracker.note(parent, parent_note(summary))
    if summary.best_trial is not None:  # the preset's trial and why (`best_trial`: by score)
        picked = {EXPORTED_TRIAL_TAG: str(summary.best_trial), PICKED_BY_TAG: summary.picked_by}
        tracker.writer.log_batch(parent, tags=picked)
    if not summary.states["complete"]:
        return
    from analysis.report import write_report

    if summary.best_trial is not None:
        study.set_user_attr(EXPORTED_ATTR, summary.best_trial)
    try:
        report = write_report(
            study,
            WorkDir(config.work_dir).report(config.study_name),
            tracking_uri=tracker.tracking_uri,
        )
        tracker.log_artifact(parent, report.folder, "report")
    except Exception as exc:  # plots are a view of the study, not part of it
        log.warning("the study's report could not be written: %s", redact(str(exc)))
        return
    summary.report_path = str(report.markdown)


def _learn_from_full_runs(tracker: Tracker, estimator: StudyEstimator, study: optuna.Study) -> None:
    """Full runs of this experiment that reported back correct this study's predictions;
    this study's own ones join its loss law's shared fit with their whole curve, and what
    they measured is kept against the trial they came from (`hpo.full_run_reports`)."""
    from analysis.calibration.full_runs import from_mlflow

    try:  # what its own full runs measured: the pick compares it with the predictions
        client, experiment = tracker.client, str(tracker.experiment_id)
        data = study.user_attrs.get(DATA_ATTR)
        record(study, full_run_results(client, experiment, study.study_name, data))
        # Its presets trained by `trl sft`: their duration against the estimate, for the user.
        record_trl(study, trl_run_results(client, experiment, study.study_name))
    except Exception as exc:
        log.warning("could not read the study's full runs from MLflow: %s", redact(str(exc)))
    calibration = estimator.calibration
    known = [r.run_id for r in calibration.loss_runs] if calibration else []
    try:
        runs = from_mlflow(tracker.client, str(tracker.experiment_id), known=known)
    except Exception as exc:  # the study goes on with what it has
        log.warning("could not read full runs from MLflow: %s", redact(str(exc)))
        return
    add_full_run_curves(study, runs, study.user_attrs.get(DATA_ATTR))
    losses, timed = estimator.absorb_full_runs(
        runs, curve_runs=curve_run_ids(study.user_attrs)
    )
    if losses or timed:
        log.info("learnt from full runs: %d final losses, %d timed runs", losses, timed)


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        elif value is not None:
            out[f"{prefix}{key}"] = value
    return out
