"""The study scores what the user gets: the full run's final loss, predicted, then fed back.

One real study (tiny llama, bundled data) with a promotion, its exported full run trained
for real, and the next study of the same work dir: every claim below is checked on them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from analysis.calibrate import main as calibrate_main
from analysis.calibration.file import load
from analysis.curves.extrapolate import CurveFit
from analysis.study_keys import END_PREDICTIONS_ATTR
from common.cli import run_cli
from hpo.config import StudyConfig, load_config
from hpo.estimator import save_cost_known
from hpo.export import main as export_main
from hpo.final_loss import curve_points, curve_run_ids, loss_one_doubling_on, shape_curves
from hpo.full_run_reports import measured_by_trial
from hpo.keys import (
    CURVE_ATTR,
    DUPLICATE_OF_ATTR,
    FIT_ATTR,
    LAW_CURVE_ATTR,
    METHOD_ATTR,
    POINTS_ATTR,
    PREDICTED_ATTR,
    PROMOTED_FROM_ATTR,
    SCORED_BY_ATTR,
)
from hpo.pick import best_complete_trial, standing_trials
from hpo.runner import run_study
from hpo.summary import StudySummary
from hpo.trial_runs import trial_schedule
from tests.configs import short_study
from tests.spaces import unpacked_default_space
from trainers.train import main as train_main

FRACTION = 0.05


def _config(work: Path, model: Path, **overrides: Any) -> StudyConfig:
    values: dict[str, Any] = {
        "study_name": "objective",
        "n_trials": 3,
        "trial_fraction": FRACTION,
        "trial_evals": 4,
        "promote": 1,
        "promote_fraction": 0.1,
        "eval_samples": 16,
        "epochs": 0.5,
        "profiles": ["fast", "balanced"],
        "sampler": "random",
        "seed": 11,
    }
    return short_study(work, model, {**values, **overrides})


@dataclasses.dataclass
class Studied:
    config: StudyConfig
    summary: StudySummary
    study: optuna.Study
    full_run: dict[str, Any]  # the exported preset's full run, as its --json report


@pytest.fixture(scope="module")
def studied(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Studied:
    work = tmp_path_factory.mktemp("objective")
    # Unpacked: packed, this half epoch of short samples is a few optimizer steps and a trial
    # one step (one point); packed trials' share of their run is tested in test_trial_runs.py.
    config = _config(work, tiny_model_dir, space=unpacked_default_space(work))
    summary = run_study(config, progress=False)
    assert summary.preset_path
    study = optuna.load_study(study_name="objective", storage=config.storage_url)
    # The full run of the preset, evaluating where its trial did, tracked in the study's store.
    trial = best_complete_trial(study)
    interval = trial_schedule(
        trial.user_attrs["full_run_steps"], fraction=FRACTION, evals=4
    ).eval_interval
    report = work / "full.json"
    code = run_cli(
        train_main,
        [
            "--preset", summary.preset_path, "--output-dir", str(work / "full"),
            "--eval-interval", str(interval), "--json", str(report), "--quiet",
            "--tracking-uri", config.tracking.uri or "",
        ],
    )  # fmt: skip
    assert code == 0
    return Studied(config, summary, study, json.loads(report.read_text()))


def test_every_trained_trial_predicts_its_full_runs_final_loss(studied: Studied) -> None:
    trained = [t for t in studied.study.trials if CURVE_ATTR in t.user_attrs]
    assert trained
    for trial in trained:
        attrs = trial.user_attrs
        band = attrs[PREDICTED_ATTR]
        assert 0 < band["p10"] <= band["p50"] <= band["p90"]
        fit = CurveFit.from_dict(attrs[FIT_ATTR])
        # How the prediction was made, and from how many of the trial's points.
        assert attrs[METHOD_ATTR] == fit.method in ("joint", "own", "fallback")
        assert attrs[POINTS_ATTR] == len(attrs[CURVE_ATTR]) >= 1
        # The fit's target is the full run's data: samples x epochs.
        assert fit.target == pytest.approx(attrs["full_run_samples"])
        assert attrs["full_run_samples"] == pytest.approx(
            studied.full_run["samples_seen"], rel=0.01
        )
        if trial.state == optuna.trial.TrialState.COMPLETE:
            # Before any full run reported back, the score is the uncorrected p50, where it
            # is sure enough to rank; the last rung's, its loss one doubling on; else the loss
            # at equal data.
            if attrs[SCORED_BY_ATTR] == "prediction":
                assert trial.value == pytest.approx(fit.p50)
            elif attrs[SCORED_BY_ATTR] == "loss_one_doubling_on":
                assert PROMOTED_FROM_ATTR in attrs  # the study's one rung (--promote 1)
                points = attrs[CURVE_ATTR]
                assert trial.value == pytest.approx(
                    loss_one_doubling_on([x for x, _ in points], [y for _, y in points]), abs=1e-6
                )
            else:
                assert attrs[SCORED_BY_ATTR] == "loss_at_fidelity"
                assert trial.value == pytest.approx(attrs[CURVE_ATTR][-1][1], abs=1e-6)
    estimate = studied.summary.best_estimate
    assert {"p10", "p50", "p90"} <= set(estimate["final_val_loss"])
    assert estimate["final_val_loss_method"] in ("joint", "own", "fallback")
    assert estimate["final_val_loss_points"] >= 1
    # At its end the study predicts the pick again with every curve it holds: the other
    # trials' (those after it too) and its shape curves (the reference run), each
    # configuration once: a trial its rung went on from is the rung's first points.
    best = studied.study.trials[studied.summary.best_trial or 0]
    others = [
        t
        for t in studied.study.trials
        if t.number != best.number and LAW_CURVE_ATTR in t.user_attrs
    ]
    went_on = {t.user_attrs.get(PROMOTED_FROM_ATTR) for t in studied.study.trials} - {None}
    assert went_on  # the rung resumed its trial: its curve holds that trial's points
    shapes = shape_curves(studied.study.user_attrs)
    expected = 1 + len(others) - len(went_on) + len(shapes)
    assert estimate["final_val_loss_curves"] == expected >= 3
    # Every standing trial is predicted again at the end, for the report's front and
    # `--pick cheapest-within`: the pick's entry is the summary's own refit.
    ends = studied.study.user_attrs[END_PREDICTIONS_ATTR]
    standing = [t for t in standing_trials(studied.study) if LAW_CURVE_ATTR in t.user_attrs]
    assert set(ends) == {str(t.number) for t in standing}
    assert ends[str(best.number)]["p50"] == pytest.approx(estimate["final_val_loss"]["p50"])
    assert ends[str(best.number)]["curves"] == estimate["final_val_loss_curves"]
    # No full run reported back yet: the band is the refit's own, uncorrected.
    assert estimate["final_val_loss"]["p50"] == pytest.approx(
        estimate["final_val_loss_uncorrected_p50"], rel=1e-5
    )


def test_trials_see_the_same_data_whatever_their_batch(studied: Studied) -> None:
    firsts = [
        t
        for t in studied.study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and PROMOTED_FROM_ATTR not in t.user_attrs
    ]
    seen = {t.user_attrs[CURVE_ATTR][-1][0] for t in firsts}
    batches = {t.user_attrs["effective_batch_size"] for t in firsts}
    assert len(batches) > 1, "the fixture should draw different effective batches"
    target = FRACTION * firsts[0].user_attrs["full_run_samples"]
    for samples in seen:  # the share of the data, to within one optimizer step
        assert abs(samples - target) <= max(batches)


def test_the_trial_is_the_start_of_its_full_run(studied: Studied) -> None:
    exported = studied.study.trials[studied.summary.best_trial or 0]
    trial_curve = dict(tuple(p) for p in exported.user_attrs[CURVE_ATTR])
    full_curve = dict(curve_points(studied.full_run["eval_records"]))
    shared = sorted(set(trial_curve) & set(full_curve))
    assert len(shared) >= 4
    for samples in shared:
        assert trial_curve[samples] == pytest.approx(full_curve[samples], abs=1e-4)
    # ... and the full run went on learning past the trial's end.
    assert studied.full_run["final_eval_loss"] < trial_curve[shared[-1]]


def test_promote_continues_the_best_configuration_in_its_run(studied: Studied) -> None:
    trials = studied.study.trials
    promoted = [t for t in trials if PROMOTED_FROM_ATTR in t.user_attrs]
    assert len(promoted) == 1
    first = trials[promoted[0].user_attrs[PROMOTED_FROM_ATTR]]
    firsts = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE and PROMOTED_FROM_ATTR not in t.user_attrs
    ]
    assert first.value == min(t.value for t in firsts)  # type: ignore[type-var]
    again = promoted[0]
    assert again.params == first.params
    assert again.user_attrs["mlflow_run_id"] == first.user_attrs["mlflow_run_id"]
    # More points of the same curve: the first ones repeat, the others go further.
    before, after = first.user_attrs[CURVE_ATTR], again.user_attrs[CURVE_ATTR]
    assert after[-1][0] > 1.5 * before[-1][0]
    shared = dict(tuple(p) for p in before).keys() & dict(tuple(p) for p in after).keys()
    assert shared
    # The promoted trial stands for the configuration: it is the one exported.
    assert studied.summary.best_trial != first.number
    run = MlflowClient(studied.summary.tracking_uri).get_run(first.user_attrs["mlflow_run_id"])
    assert run.data.tags["hpo.promoted_trial_number"] == str(again.number)
    assert run.info.status == "FINISHED"


def test_a_full_run_corrects_the_next_studys_prediction(
    studied: Studied, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = studied.full_run
    assert report["status"] == "finished"
    predicted = report["estimate"]["final_val_loss_uncorrected_p50"]
    # By file: analysis.calibrate --full-run folds the run's loss into the calibration.
    work = Path(studied.config.work_dir)
    out = tmp_path / "calibration.json"
    out.write_bytes((work / "calibration.json").read_bytes())
    (tmp_path / "full.json").write_text(json.dumps(report))
    code = run_cli(calibrate_main, ["--full-run", str(tmp_path / "full.json"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    correction = load(out).loss_correction
    assert correction.n_runs == 1
    # One run moves predictions half-way (in log space) to what it measured.
    assert correction.scale == pytest.approx((report["final_eval_loss"] / predicted) ** 0.5)

    # By MLflow: the study, continued, reads the run's report itself. The run's curve joins
    # its fit, so the study's correction leaves that run out: what it measured counts once.
    summary = run_study(dataclasses.replace(studied.config, n_trials=6), progress=False)
    study = optuna.load_study(study_name="objective", storage=studied.config.storage_url)
    assert len(curve_run_ids(study.user_attrs)) == 1  # the full run of its preset
    newest = [t for t in study.trials if t.number >= 4 and CURVE_ATTR in t.user_attrs]
    assert newest
    estimate = newest[0].user_attrs["estimate"]
    assert estimate["loss_correction"] == {"scale": 1.0, "runs": 0, "curve_runs": 1}
    assert estimate["final_val_loss"]["p50"] == pytest.approx(
        estimate["final_val_loss_uncorrected_p50"], rel=1e-4
    )
    assert summary.best_estimate["loss_correction"]["curve_runs"] == 1
    # What it measured is kept against the trial its preset came from, and the pick weighs
    # it: that configuration stays unless another one's level is predicted below it.
    measured, source = report["final_eval_loss"], int(report["provenance"]["trial"])
    ran = {n: r.loss for n, r in measured_by_trial(study.user_attrs).items()}
    assert ran == {source: pytest.approx(measured)} and len(summary.measured_full_runs) == 1
    best = next(t for t in study.trials if t.number == summary.best_trial)
    if source in (best.number, best.user_attrs.get(PROMOTED_FROM_ATTR)):
        assert summary.picked_by.startswith(f"measured: its full run ended at {measured:.4f}")
        assert summary.best_estimate["final_val_loss_measured"]["loss"] == pytest.approx(measured)
    else:
        assert f"below the {measured:.4f} that trial {source}'s full run measured" in (
            summary.picked_by
        )
        assert summary.best_estimate["final_val_loss"]["p50"] < measured
        assert "final_val_loss_measured" not in summary.best_estimate
    assert summary.report_path  # the report lists it as well
    text = Path(summary.report_path).read_text(encoding="utf-8")
    assert f"trial {source}: {measured:.4f} (MLflow run " in text
    # `hpo.export` picks the same, by the same levels, and its preset says why.
    out = tmp_path / "again.yaml"
    storage = ["--study-name", "objective", "--storage", studied.config.storage_url]
    assert run_cli(export_main, [*storage, "--out", str(out)]) == 0, capsys.readouterr().err
    preset = yaml.safe_load(out.read_text())
    assert preset["provenance"]["trial"] == summary.best_trial
    assert preset["provenance"]["picked_by"] == summary.picked_by
    # The study's run in the MLflow UI names the same trial and rule.
    tags = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_parent_run_id).data.tags
    assert tags["exported_trial"] == str(summary.best_trial)
    assert tags["picked_by"] == summary.picked_by
    # Another study of the work dir holds no curve of that run: the run corrects it. Its one
    # trial (no peer, no shape curve) is a fallback, whose shape is not identified: the
    # correction applies as fitted.
    config = dataclasses.replace(
        studied.config, study_name="objective-next", n_trials=1,
        trial=dataclasses.replace(studied.config.trial, promote=0),
    )  # fmt: skip
    run_study(config, progress=False)
    (trial,) = optuna.load_study(study_name="objective-next", storage=config.storage_url).trials
    estimate = trial.user_attrs["estimate"]
    assert estimate["final_val_loss_method"] == "fallback"
    assert estimate["loss_correction"] == {"scale": pytest.approx(correction.scale), "runs": 1}
    scaled = estimate["final_val_loss_uncorrected_p50"] * correction.scale
    assert estimate["final_val_loss"]["p50"] == pytest.approx(scaled, rel=1e-4)
    # Resumed with the same promotion: nothing promoted twice.
    promoted = [
        t.user_attrs[PROMOTED_FROM_ATTR] for t in study.trials if PROMOTED_FROM_ATTR in t.user_attrs
    ]
    assert len(promoted) == len(set(promoted))


def test_a_promotion_queued_twice_trains_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Workers ending together may each queue the best configuration's promotion: the first
    queued trains, the other ends pruned, untrained, naming it."""
    space = unpacked_default_space(tmp_path)  # packed, a trial and its promotion are 1 step
    config = _config(tmp_path, tiny_model_dir, n_trials=1, promote=0, space=space)
    run_study(config, progress=False)
    study = optuna.load_study(study_name="objective", storage=config.storage_url)
    first = study.trials[0]
    for _ in range(2):
        study.enqueue_trial(first.params, user_attrs={PROMOTED_FROM_ATTR: first.number})
    run_study(dataclasses.replace(config, n_trials=3), progress=False)
    study = optuna.load_study(study_name="objective", storage=config.storage_url)
    runs, twin = [t for t in study.trials if PROMOTED_FROM_ATTR in t.user_attrs]
    assert runs.state == optuna.trial.TrialState.COMPLETE
    assert runs.user_attrs["trial_fraction"] == 2 * first.user_attrs["trial_fraction"]
    assert runs.user_attrs[CURVE_ATTR][-1][0] > first.user_attrs[CURVE_ATTR][-1][0]
    assert twin.state == optuna.trial.TrialState.PRUNED
    assert twin.user_attrs[DUPLICATE_OF_ATTR] == runs.number
    assert twin.user_attrs["state_reason"] == (
        f"trial {runs.number} already promotes trial {first.number}"
    )
    assert CURVE_ATTR not in twin.user_attrs and "mlflow_run_id" not in twin.user_attrs


def test_loss_at_fidelity_scores_the_last_loss(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, tiny_model_dir, objective="loss_at_fidelity", n_trials=1, promote=0)
    run_study(config, progress=False)
    trial = optuna.load_study(study_name="objective", storage=config.storage_url).trials[0]
    assert trial.value == pytest.approx(trial.user_attrs[CURVE_ATTR][-1][1], abs=1e-6)


@pytest.mark.parametrize(
    ("steps", "fraction", "evals", "expected"),
    [
        (338, 0.1, 6, (34, 5)),  # effective batch 8 on the demo data
        (85, 0.1, 6, (8, 1)),  # effective batch 32: the same data, fewer steps
        (20, 0.1, 6, (2, 1)),
        (3, 0.1, 6, (1, 1)),  # at least one step
        (10, 1.0, 4, (10, 2)),  # the whole run
    ],
)
def test_trial_schedule(steps: int, fraction: float, evals: int, expected: tuple[int, int]) -> None:
    schedule = trial_schedule(steps, fraction=fraction, evals=evals)
    assert (schedule.stop_after_steps, schedule.eval_interval) == expected


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("objective", "accuracy", "objective must be one of"),
        ("trial_fraction", 0.0, "trial_fraction must be in (0, 1]"),
        ("trial_fraction", 1.5, "trial_fraction must be in (0, 1]"),
        ("trial_max_steps", 30, "trial_max_steps (now trial_fraction"),
        ("promote", -1, "promote must be an integer >= 0"),
    ],
)
def test_bad_objective_settings_name_the_field(field: str, value: Any, message: str) -> None:
    from common.errors import BadInputError

    with pytest.raises(BadInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, {field: value})


def test_full_runs_fold_into_the_calibration_once(studied: Studied, tmp_path: Path) -> None:
    from analysis.calibration.file import LossRun
    from analysis.calibration.full_runs import FullRun, absorb

    report = studied.full_run
    base = load(Path(studied.config.work_dir) / "calibration.json")
    # The calibration as it was before any full run reported back (a later study may have
    # absorbed this one already).
    own = FullRun("x", report).measurements()
    assert own is not None
    base = dataclasses.replace(
        base, runs=tuple(r for r in base.runs if r != own.capped()), loss_runs=()
    )
    finished = FullRun("run-a", report)
    slower = [1.1 * x for x in report["micro_step_seconds"]]
    stopped = FullRun(
        "run-b", {**report, "status": "stopped_by_window", "micro_step_seconds": slower}
    )
    elsewhere = FullRun(
        "run-c", {**report, "estimate": {**report["estimate"], "hardware_fingerprint": "other"}}
    )
    calibration, losses, timed = absorb(base, [finished, stopped, elsewhere])
    # The finished run teaches both; the stopped one only time; another machine's nothing.
    assert (losses, timed) == (1, 2)
    # A run on two GPUs teaches the loss only: its steps waited for the other GPU.
    two = FullRun("run-d", {**report, "spec": {**report["spec"], "gpus": 2}})
    assert two.measurements() is None and two.loss_run() is not None
    assert len(calibration.runs) == len(base.runs) + 2
    again, losses, timed = absorb(calibration, [finished])
    assert (losses, timed) == (0, 0) and again.loss_runs == calibration.loss_runs
    # The loss section survives the file.
    path = tmp_path / "calibration.json"
    calibration.save(path)
    loaded = load(path)
    assert loaded.loss_runs == (
        LossRun(
            "run-a", report["estimate"]["final_val_loss_uncorrected_p50"], report["final_eval_loss"]
        ),
    )
    assert loaded.loss_correction == calibration.loss_correction
    assert json.loads(path.read_text())["loss"]["correction"]["n_runs"] == 1


def test_runs_read_without_opening_them(studied: Studied) -> None:
    client = MlflowClient(studied.summary.tracking_uri)
    parent = client.get_run(studied.summary.mlflow_parent_run_id)
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith("Study 'objective': ") and str(studied.summary.preset_path) in note
    for trial in studied.study.trials:
        run = client.get_run(trial.user_attrs["mlflow_run_id"])
        text = run.data.tags["mlflow.note.content"]
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert text.startswith("complete: predicted final loss ")
        else:
            assert text.split(":")[0] in ("pruned", "pruned before training", "failed")
    # The study's report, on its parent run.
    listed = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/history.png", "report/curves.png"} <= listed
    assert Path(studied.summary.report_path or "").is_file()


def test_trials_time_one_save_and_keep_none(studied: Studied) -> None:
    """A trial saves a checkpoint at its end to time it; the full run's saves are predicted
    from that measurement (not the prior's guess), and no trial leaves one on disk."""
    work = Path(studied.config.work_dir)
    trained = [p for p in (work / "trials").iterdir() if p.is_dir()]
    assert trained and not list((work / "trials").glob("*/checkpoint-*"))
    calibration = load(work / "calibration.json")
    saves = [s for run in calibration.runs for s in run.checkpoint_seconds]
    assert saves and all(s > 0 for s in saves)
    prior = calibration.prior.checkpoint_fixed_seconds
    assert calibration.coefficients.checkpoint_fixed_seconds != prior
    # Each trial of the first study timed its save only while the saves before it did not
    # yet tell the cost (its calibration runs are the first ones, in trial order).
    first = [t for t in studied.study.trials if "steps_seconds" in t.user_attrs][:4]
    for i, (trial, run) in enumerate(zip(first, calibration.runs, strict=False)):
        assert trial.user_attrs["timed_checkpoint_save"] is not save_cost_known(
            calibration.runs[:i]
        )
        assert len(run.checkpoint_seconds) == int(trial.user_attrs["timed_checkpoint_save"])
