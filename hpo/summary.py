"""What a study ends with: the summary, the best trial exported, and the lines it prints."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from analysis.calibration.full_runs import trl_runs
from analysis.search.quality import pick_lines
from common.fmt import format_duration, format_hours
from common.redact import redact
from common.workdir import WorkDir
from hpo.config import StudyConfig
from hpo.export import (
    PARAM_KEYS,
    current_correction,
    end_predictions,
    export_estimate,
    export_study,
)
from hpo.feasible_sampler import redraw_counts, redraw_line
from hpo.keys import END_PREDICTIONS_ATTR, PARENT_ATTR, REFERENCE_ATTR, SCORED_BY_ATTR
from hpo.pick import measured_standing, pick_trial, standing_trials
from hpo.reference_run import reference_line
from hpo.states import state_counts, trial_loss
from hpo.tracking import Tracker
from trainers.preset import launch_command, launch_note

_BEST_KEYS = (*PARAM_KEYS, "effective_batch_size")


@dataclass
class StudySummary:
    study_name: str
    states: dict[str, int]
    best_value: float | None
    best_params: dict[str, Any]
    best_trial: int | None
    best_estimate: dict[str, Any]
    preset_path: str | None
    mlflow_experiment_id: str
    mlflow_parent_run_id: str
    elapsed_seconds: float
    tracking_uri: str
    objective: str = "predicted_full_run_loss"
    report_path: str | None = None
    objectives: list[str] = dataclasses.field(default_factory=lambda: ["loss"])
    # Several objectives: the standing trials no other beats on both, cheapest first, each
    # {"trial", "loss", "hours" or "cost"}.
    pareto_front: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # MLflow records the tracking server did not take: they wait in `tracking_spool`.
    tracking_records_waiting: int = 0
    tracking_spool: str | None = None
    # The search's plan against what it spent (hours, cost) and which limit ended it.
    search: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What the best trial's score is: "prediction" (the full run's predicted final loss),
    # "loss_at_fidelity" (its loss at the trials' share of the data) or
    # "loss_one_doubling_on" (the last rung's: its loss one doubling on).
    best_scored_by: str | None = None
    # The loss-shape reference run (`hpo.reference_run`): what it ran, spent and fitted.
    reference_run: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Proposals drawn again or repaired before training (`hpo.feasible_sampler`): counts.
    redrawn: dict[str, int] = dataclasses.field(default_factory=dict)
    # The rule that picked the best trial (`hpo.pick.pick_trial`), as the preset records it.
    picked_by: str = ""
    # The standing configurations whose full runs reported back (`hpo.full_run_reports`): {trial
    # number: the final loss its most recent full run measured}.
    measured_full_runs: dict[int, float] = dataclasses.field(default_factory=dict)
    # What the preset's launch command needs beside it: the full run's GPUs (empty for one).
    launch_note: str = ""
    # The study's presets trained by `trl sft` that reported back: one line each, their
    # `train_runtime` against the estimate (`analysis.calibration.full_runs.TrlRun.line`).
    trl_runs: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(
    study: optuna.Study, config: StudyConfig, tracker: Tracker, parent: str
) -> StudySummary:
    """The study's outcome; the best complete trial exported as the preset."""
    summary = StudySummary(
        study_name=config.study_name,
        states=state_counts(study),
        best_value=None,
        best_params={},
        best_trial=None,
        best_estimate={},
        preset_path=None,
        mlflow_experiment_id=str(tracker.experiment_id),
        mlflow_parent_run_id=str(study.user_attrs.get(PARENT_ATTR, parent)),
        elapsed_seconds=0.0,  # set when the study is closed
        tracking_uri=tracker.tracking_uri,
        objective=config.objective,
        objectives=list(config.objectives),
        reference_run=dict(study.user_attrs.get(REFERENCE_ATTR) or {}),
        redrawn=redraw_counts(study.get_trials(deepcopy=False)),
        launch_note=launch_note(config.gpus, config.device),
        trl_runs=[run.line() for run in trl_runs(study.user_attrs)],
    )
    if not summary.states["complete"]:
        return summary
    if config.multi_objective:
        summary.pareto_front = pareto_points(study, config.objectives[1])
    # The levels the report's front compares, refitted with every curve the study holds.
    refits = end_predictions(study)
    study.set_user_attr(END_PREDICTIONS_ATTR, {str(n): r.end_band() for n, r in refits.items()})
    # Against a full run that reported back, the best configuration without one weighs in
    # by its refitted level.
    best, rule = pick_trial(study, losses={n: r.final.band()["p50"] for n, r in refits.items()})
    summary.best_value, summary.best_trial = trial_loss(best), best.number
    summary.picked_by = rule
    summary.measured_full_runs = {n: r.loss for n, r in sorted(measured_standing(study).items())}
    summary.best_scored_by = best.user_attrs.get(SCORED_BY_ATTR)
    correction = current_correction(study, best)
    # The pick's refit serves the summary and the preset (made with this same correction).
    refit = refits.get(best.number) if correction is not None else None
    summary.best_estimate = export_estimate(study, best, correction=correction, refit=refit)
    summary.best_params = {k: best.user_attrs[k] for k in _BEST_KEYS if k in best.user_attrs}
    if "gpus" in best.params:  # a searched GPU count: the pick's own node size
        summary.launch_note = launch_note(int(best.params["gpus"]), config.device)
    preset = export_study(
        study,
        WorkDir(config.work_dir).preset(config.study_name),
        storage_url=config.storage_url,
        trial=best,
        picked_by=rule,
        tracking_uri=tracker.tracking_uri,
        tracker=tracker,
        refit=refit,
    )
    summary.preset_path = str(preset)
    return summary


def pareto_points(study: optuna.Study, second: str) -> list[dict[str, Any]]:
    """The Pareto front of a loss-and-hours (or cost) study, cheapest first.

    Taken over the standing trials (a promoted trial stands for its configuration), from
    the values Optuna minimised.
    """
    from analysis.report.pareto import pareto_front

    standing = [t for t in standing_trials(study) if t.values and len(t.values) == 2]
    front = pareto_front((t.values[0], t.values[1], t.number) for t in standing)
    return [{"trial": number, "loss": loss, second: other} for loss, other, number in front]


def parent_note(summary: StudySummary) -> str:
    """One sentence for the study's parent run: what was tried and what came out."""
    states = summary.states
    tried = f"{states['complete']} complete, {states['pruned']} pruned, {states['failed']} failed"
    if summary.best_trial is None:
        return f"Study '{summary.study_name}': {tried}; nothing to export."
    estimate = summary.best_estimate
    loss = estimate.get("final_val_loss") or {}
    hours = estimate.get("duration_hours") or {}
    parts = [f"Study '{summary.study_name}': {tried}; best trial {summary.best_trial}"]
    ran = estimate.get("final_val_loss_measured") or {}
    if "loss" in ran:
        parts.append(f"its full run measured {ran['loss']:.3g}")
    if loss:
        parts.append(
            f"predicted final loss {loss['p50']:.3g} ({loss['p10']:.3g}-{loss['p90']:.3g})"
        )
    if hours:
        parts.append(f"full run {format_duration(hours['p50'] * 3600)}")
    return ", ".join(parts) + f"; preset {summary.preset_path}."


def print_summary(summary: StudySummary, server: dict[str, Any]) -> None:
    """The lines `python -m hpo.study` ends with; `server`: mlflow.yaml's UI host and port."""
    states = summary.states
    print(
        f"study '{summary.study_name}': {states['complete']} complete, {states['pruned']} pruned, "
        f"{states['failed']} failed in {summary.elapsed_seconds:.0f} s"
    )
    _print_search(summary.search or {})
    if summary.reference_run:
        print(reference_line(summary.reference_run))
    if summary.redrawn:
        print(redraw_line(summary.redrawn))
    if summary.best_value is None:
        print("no trial completed: nothing to export")
    else:
        _print_best(summary)
    if summary.trl_runs:
        print("its presets trained by trl sft, against the estimate (the model's load aside):")
        for line in summary.trl_runs:
            print(f"  {line}")
    _print_ui(summary, server)
    waiting = summary.tracking_records_waiting
    if waiting:
        print(
            f"{waiting} MLflow records wait for the tracking server in {summary.tracking_spool}; "
            f"send them with: python -m hpo.tracking --replay {summary.tracking_spool}"
        )


def _print_best(summary: StudySummary) -> None:
    by_prediction = summary.objective == "predicted_full_run_loss" and (
        summary.best_scored_by in (None, "prediction")
    )
    what = (
        "its full run's predicted final validation loss, before correction"
        if by_prediction
        else "its validation loss one doubling on from its last rung's share of the data"
        if summary.best_scored_by == "loss_one_doubling_on"
        else "its validation loss at the trials' share of the data"
    )
    print(f"best trial {summary.best_trial}: score {summary.best_value:.4f} ({what})")
    if summary.measured_full_runs:  # the pick weighed what full runs measured: say how
        runs = ", ".join(f"trial {n} {loss:.4f}" for n, loss in summary.measured_full_runs.items())
        print(f"  picked against the full runs that reported back ({runs}): {summary.picked_by}")
    for key, value in summary.best_params.items():
        shown = f"{value:.3g}" if isinstance(value, float) else value
        print(f"  {key:<28} {shown}")
    _print_estimate(summary.best_estimate)
    _print_pareto(summary)
    print(f"preset: {summary.preset_path}")
    # Tracked in the study's store, the full run reports back: the next study reads its loss
    # and its curve (trainers.train tracks nothing without --tracking-uri).
    uri = redact(summary.tracking_uri or "")
    command = launch_command(
        summary.preset_path or "", tracking_uri=uri if uri and uri != "off" else None
    )
    ran = summary.best_estimate.get("final_val_loss_measured") or {}
    if "loss" in ran:  # the pick is a configuration already trained in full
        print(f"trained already (MLflow run {ran.get('run_id')}); to train it again: {command}")
    else:
        print(f"train it{summary.launch_note}: {command}")
    if summary.report_path:
        print(f"report: {summary.report_path} (also on the study's MLflow run, under report/)")


def _print_ui(summary: StudySummary, server: dict[str, Any]) -> None:
    """Where to see the study in MLflow's UI (and how to start one for a local store)."""
    host, port = server.get("host", "127.0.0.1"), server.get("port", 5000)
    uri = redact(summary.tracking_uri)
    if uri.startswith(("http://", "https://")):
        base = uri.rstrip("/")
    else:
        print("open the MLflow UI:")
        print(
            f"  {Path(sys.executable)} -m mlflow server --backend-store-uri {uri} --host {host} --port {port}"
        )
        base = f"http://{host}:{port}"
    print(
        f"  {base}/#/experiments/{summary.mlflow_experiment_id}/runs?workflowType=machine_learning"
    )


def _print_pareto(summary: StudySummary) -> None:
    """Loss against hours or cost: the configurations no other one beats on both."""
    if not summary.pareto_front:
        return
    second = summary.objectives[1]
    print(f"Pareto front (predicted loss against full-run {second}), cheapest first:")
    for point in summary.pareto_front:
        amount = f"{point[second]:.3g} h" if second == "hours" else f"{point[second]:.2f}"
        print(f"  trial {point['trial']:<4} loss {point['loss']:.4f}  {second} {amount}")
    print("export another: python -m hpo.export --trial N, or --pick cheapest-within PCT")


def _print_search(search: dict[str, Any]) -> None:
    """The search's plan against what it spent, and which limit ended it.

    Two plans, each with what it counts: the one printed before the first trial (the time
    model's prior for a trial's fixed part, the base model's load once per worker) and the
    one refitted to what the trials measured (their median fixed part, the load in it).
    """
    if not search:
        return
    opening = search.get("opening")
    if opening:
        line = (
            f"search: planned {format_hours(opening['planned_hours'])} of GPU time at the "
            f"start ({plan_parts(opening)}, at {search['fidelity']:.3g} of their full run), "
            f"re-planned {format_hours(search['planned_hours'])} on the trials' measured cost "
            f"({plan_parts(search)}); spent {format_hours(search['spent_hours'])}"
        )
    else:
        line = (
            f"search: planned {format_hours(search['planned_hours'])} of GPU time ({plan_parts(search)}, at {search['fidelity']:.3g} of "
            f"their full run); spent {format_hours(search['spent_hours'])}"
        )
    if search.get("budget_hours"):
        line += f" of a {format_hours(search['budget_hours'])} budget ({search['source']})"
    if search.get("price_per_hour"):
        line += f"; cost {search['spent_cost']:.2f} spent, {search['planned_cost']:.2f} planned"
    print(f"{line}; ended by {search['ended_by']}")
    expected = search.get("expected_pick")
    if expected:  # what a search of its size bought on recorded real curves
        for text in pick_lines(float(search.get("training_full_runs") or 0.0), True):
            print(text.strip())


def plan_parts(plan: dict[str, Any]) -> str:
    """What a plan's GPU time counts: set-up, base model loads and trials (a `SearchPlan` dict)."""
    parts = []
    if plan.get("before_trials_hours"):
        parts.append(f"set-up {format_hours(plan['before_trials_hours'])}")
    loads = plan.get("workers", 1) * plan.get("once_hours", 0.0)
    if loads:
        parts.append(f"model load {format_hours(loads)}")
    parts.append(f"{plan['trials']} trials x {format_hours(plan['trial_hours'])}")
    if plan.get("promote"):
        parts.append(f"{plan['promote']} promoted {format_hours(plan['promote_hours'])}")
    return " + ".join(parts)


def _print_estimate(estimate: dict[str, Any]) -> None:
    ran = estimate.get("final_val_loss_measured") or {}
    if "loss" in ran and ran.get("best_step") is not None:  # early stopping ended it
        print(
            f"full run's validation loss: {ran['loss']:.4f} measured by its full run at its "
            f"best checkpoint (step {ran['best_step']:,}), where early stopping ended it "
            f"(MLflow run {ran.get('run_id')})"
        )
    elif "loss" in ran:
        print(
            f"full run's final validation loss: {ran['loss']:.4f} measured by its full run "
            f"(MLflow run {ran.get('run_id')})"
        )
    loss = estimate.get("final_val_loss") or {}
    if {"p10", "p50", "p90"} <= set(loss):
        correction = estimate.get("loss_correction") or {}
        corrected, curves_of_runs = correction.get("runs", 0), correction.get("curve_runs", 0)
        sources = [f"corrected by {corrected} full runs"] if corrected else []
        if curves_of_runs:  # the study's own full runs: in the fit, not in the correction
            sources.append(f"{curves_of_runs} of its full runs' curves in the fit")
        source = "; ".join(sources) or "no full run reported yet"
        method = estimate.get("final_val_loss_method")
        if method:  # joint / own / fallback, and from how many of the trial's points
            how = f"{method}, {estimate.get('final_val_loss_points', '?')} points"
            curves = int(estimate.get("final_val_loss_curves") or 0)
            if curves > 1:  # refitted with the study's curves as they stand at its end
                how += f" with {curves - 1} other curves"
            source = f"{how}; {source}"
        what = "predicted from its trial" if "final_val_loss_measured" in estimate else "predicted"
        print(
            f"full run's final validation loss: {loss['p50']:.4f} {what} "
            f"(p10-p90 {loss['p10']:.4f} to {loss['p90']:.4f}; {source})"
        )
    hours = estimate.get("duration_hours") or {}
    if "p50" not in hours:
        return
    gpus = int(estimate.get("gpus") or 1)
    on = f" on {gpus} GPUs" if gpus > 1 else ""
    line = f"full run{on}: {format_hours(hours['p50'])} predicted"
    if "p10" in hours and "p90" in hours:
        line += f" (p10-p90 {format_hours(hours['p10'])} to {format_hours(hours['p90'])})"
    if "available_hours" in estimate:
        verdict = "fits" if estimate.get("fits_window") else "does NOT fit"
        line += f"; {verdict} the {format_hours(estimate['available_hours'])} available"
    cost = estimate.get("cost") or {}
    if isinstance(cost, dict) and cost.get("p50"):
        line += f"; cost about {cost['p50']:.2f}"
    print(line)
