"""End-to-end studies with real training: Optuna and MLflow agree, resume, export round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from hpo.config import load_config
from hpo.runner import run_study
from tests.cli import run_module
from trainers.preset import PRESET_VERSION

STATE_NAMES = {
    optuna.trial.TrialState.COMPLETE: "complete",
    optuna.trial.TrialState.PRUNED: "pruned",
    optuna.trial.TrialState.FAIL: "failed",
}


def small_config(work: Path, tiny_model_dir: Path, **overrides: object):
    values: dict[str, object] = {
        "model": str(tiny_model_dir),
        "work_dir": str(work),
        "study_name": "e2e",
        "n_trials": 4,
        "trial_fraction": 0.06,
        "trial_evals": 3,
        "eval_samples": 16,
        "profiles": ["fast"],
        "sampler": "random",
        "pruner": "median",
        "rungs": "none",  # the trials asked for, each once: what this file counts
        "seed": 3,
    }
    values.update(overrides)
    return load_config(None, values)


def child_runs(tracking_uri: str, experiment_id: str, parent: str) -> list:
    client = MlflowClient(tracking_uri=tracking_uri)
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )
    return list(runs)


@pytest.fixture(scope="module")
def study_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("study")
    config = small_config(work, tiny_model_dir)
    summary = run_study(config, progress=False)
    return config, summary


def test_optuna_and_mlflow_hold_every_trial_once(study_run) -> None:
    config, summary = study_run
    study = optuna.load_study(study_name="e2e", storage=config.storage_url)
    trials = study.get_trials(states=tuple(STATE_NAMES))
    assert len(trials) == 4
    runs = child_runs(
        summary.tracking_uri, summary.mlflow_experiment_id, summary.mlflow_parent_run_id
    )
    by_number = {int(r.data.tags["hpo.trial_number"]): r for r in runs}
    assert len(runs) == len(by_number) == 4  # exactly once each
    assert sorted(by_number) == sorted(t.number for t in trials)
    for trial in trials:
        run = by_number[trial.number]
        assert run.data.tags["state"] == STATE_NAMES[trial.state]
        assert run.info.run_name == f"trial-{trial.number:03d}"
        for key in ("micro_batch_size", "gradient_accumulation_steps", "lora_r", "profile"):
            assert run.data.params[key] == str(trial.user_attrs[key])
        assert float(run.data.params["learning_rate"]) == pytest.approx(
            trial.user_attrs["learning_rate"], rel=1e-5
        )
        assert run.data.params["effective_batch_size"] == str(
            trial.user_attrs["micro_batch_size"] * trial.user_attrs["gradient_accumulation_steps"]
        )
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert run.data.metrics["value"] == pytest.approx(trial.value)
            assert run.info.status == "FINISHED"
        # The naive full-run figure is recorded, clearly named.
        assert trial.user_attrs["naive_full_run_seconds"] > 0
        # What the process held as training began (a worker's leak shows in it).
        assert trial.user_attrs["start_memory_bytes"] > 0
    assert summary.states == {
        name: sum(1 for t in trials if STATE_NAMES[t.state] == name)
        for name in STATE_NAMES.values()
    }


def test_metric_histories_are_per_step(study_run) -> None:
    config, summary = study_run
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    run_id = (
        optuna.load_study(study_name="e2e", storage=config.storage_url)
        .trials[0]
        .user_attrs["mlflow_run_id"]
    )
    history = client.get_metric_history(run_id, "train_loss")
    assert len(history) >= 4 and [m.step for m in history] == sorted(m.step for m in history)
    assert len(client.get_metric_history(run_id, "val_loss")) >= 1


def test_parent_run_carries_counts_and_best(study_run) -> None:
    _, summary = study_run
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    parent = client.get_run(summary.mlflow_parent_run_id)
    metrics = parent.data.metrics
    assert metrics["n_complete"] == summary.states["complete"]
    assert metrics["n_pruned"] == summary.states["pruned"]
    assert metrics["best_value"] == pytest.approx(summary.best_value)
    artifacts = [a.path for a in client.list_artifacts(summary.mlflow_parent_run_id)]
    assert "e2e.yaml" in artifacts


def test_parent_run_has_the_data_as_its_dataset_input(study_run) -> None:
    from tests.test_mlflow_lineage import check_dataset_input
    from trainers.data.paths import demo_data_path

    _, summary = study_run
    data = demo_data_path("prompt_completion")
    rows = sum(1 for line in data.read_text().splitlines() if line.strip())
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    check_dataset_input(client, summary.mlflow_parent_run_id, data, rows, "prompt_completion")


def test_export_trl_names_the_trial_and_the_data(study_run, tmp_path: Path) -> None:
    from common.cli import run_cli
    from hpo.export import main
    from trainers.data.paths import demo_data_path

    config, summary = study_run
    out = tmp_path / "trl.yaml"
    argv = ["--study-name", "e2e", "--storage", config.storage_url, "--out", str(out)]
    assert run_cli(main, [*argv, "--format", "trl"]) == 0
    text = out.read_text()
    assert f"study e2e, trial {summary.best_trial}" in text
    trl = yaml.safe_load(text)
    assert trl["lora_r"] == summary.best_params["lora_r"]
    assert trl["per_device_train_batch_size"] == summary.best_params["micro_batch_size"]
    assert trl["datasets"][0]["data_files"] == str(demo_data_path("prompt_completion").resolve())
    # The steps the preset's estimate timed; held out, the samples its run evaluates.
    preset = yaml.safe_load(Path(summary.preset_path).read_text())
    assert trl["max_steps"] == preset["estimate"]["full_run_steps"] > 0
    records = len(demo_data_path("prompt_completion").read_text().splitlines())
    assert math.ceil(trl["test_split_size"] * records) == preset["training"]["eval_samples"]
    # Its TRL run is tracked in the study's store, nested under the study's run.
    env = trl["env"]
    assert trl["report_to"] == ["mlflow"] and env["MLFLOW_TRACKING_URI"] == summary.tracking_uri
    tags = json.loads(env["MLFLOW_TAGS"])
    assert tags["mlflow.parentRunId"] == summary.mlflow_parent_run_id
    assert tags["hpo.trial_number"] == str(summary.best_trial)


def test_resume_adds_no_duplicates(study_run, tiny_model_dir: Path) -> None:
    config, summary = study_run
    more = small_config(Path(config.work_dir), tiny_model_dir, n_trials=5)
    again = run_study(more, progress=False)
    assert again.mlflow_parent_run_id == summary.mlflow_parent_run_id
    study = optuna.load_study(study_name="e2e", storage=config.storage_url)
    numbers = [t.number for t in study.get_trials(states=tuple(STATE_NAMES))]
    assert numbers == [0, 1, 2, 3, 4]
    runs = child_runs(again.tracking_uri, again.mlflow_experiment_id, again.mlflow_parent_run_id)
    assert sorted(int(r.data.tags["hpo.trial_number"]) for r in runs) == numbers
    # Running once more with the target already met trains nothing new.
    third = run_study(more, progress=False)
    assert sum(third.states.values()) == 5


def test_export_preset_round_trip(study_run, tmp_path: Path) -> None:
    config, summary = study_run
    out = tmp_path / "best.yaml"
    proc = run_module(
        "hpo.export", "--study-name", "e2e", "--storage", config.storage_url, "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not library_notices(proc.stderr)
    preset = yaml.safe_load(out.read_text())
    assert preset["version"] == PRESET_VERSION
    assert set(preset) >= {"model", "lora", "data", "training", "estimate", "provenance"}
    assert preset["provenance"]["study"] == "e2e"
    assert preset["provenance"]["trial"] == summary.best_trial
    assert preset["provenance"]["mlflow_parent_run_id"] == summary.mlflow_parent_run_id
    assert preset["provenance"]["work_dir"] == str(Path(config.work_dir).resolve())
    assert preset["training"]["micro_batch_size"] == summary.best_params["micro_batch_size"]
    assert preset["lora"]["r"] == summary.best_params["lora_r"]

    result_json = tmp_path / "train.json"
    proc = run_module(
        "trainers.train", "--preset", str(out), "--max-steps", "5",
        "--output-dir", str(tmp_path / "run"), "--json", str(result_json), "--quiet",
        timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(result_json.read_text())
    assert result["optimizer_steps"] == 5
    assert result["micro_batch_size"] == preset["training"]["micro_batch_size"]
    assert result["lora_r"] == preset["lora"]["r"]


def library_notices(stderr: str) -> list[str]:
    """Lines the libraries add on their own (MLflow's INFO log, Python warnings): none is
    the user's concern, and they would print around the command's summary
    (`common.library_logs`)."""
    return [line for line in stderr.splitlines() if "Warning: " in line or " INFO mlflow" in line]


def test_study_cli_json(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    proc = run_module(
        "hpo.study", "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "w"),
        "--n-trials", "2", "--trial-fraction", "0.015", "--trial-evals", "2", "--eval-samples", "8",
        "--profiles", "fast", "--study-name", "cli", "--json", str(out), "--no-progress",
        timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    for key in ("study_name", "states", "best_value", "best_params", "preset_path",
                "mlflow_experiment_id", "mlflow_parent_run_id", "elapsed_seconds"):  # fmt: skip
        assert key in payload, key
    assert payload["study_name"] == "cli"
    # The default rungs: of 2 trials the better goes on (a rung leaves one behind), the
    # second rung has one configuration to choose from and runs none.
    assert payload["states"] == {**payload["states"], "complete": 3}
    assert sum(payload["states"].values()) == 3
    assert Path(payload["preset_path"]).is_file()
    assert "workflowType=machine_learning" in proc.stdout
    assert "mlflow server --backend-store-uri" in proc.stdout
    assert not library_notices(proc.stderr)  # nothing of theirs around the summary
