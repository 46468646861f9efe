"""Several workers on one study through a real PostgreSQL server; a worker that dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import psycopg
import pytest
from mlflow import MlflowClient

from tests.cli import start_module

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def _database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url.replace("postgresql://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def _worker(tiny_model_dir: Path, work: Path, storage: str, tracking: str, *extra: str) -> subprocess.Popen[str]:
    work.mkdir(parents=True, exist_ok=True)
    return start_module(
        "hpo.study", "--no-progress", "--model", str(tiny_model_dir),
        "--work-dir", str(work), "--storage", storage, "--tracking-uri", tracking,
        "--trial-fraction", "0.015", "--trial-evals", "2", "--eval-samples", "8",
        "--profiles", "fast", "--pruner", "none", "--rungs", "none", "--json", str(work / "summary.json"), *extra,
        cwd=work,
    )  # fmt: skip


@pytest.mark.timeout(900)
def test_two_workers_share_one_study(postgres: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    storage, tracking = _database(postgres, "optuna_a"), _database(postgres, "mlflow_a")
    workers = [
        _worker(tiny_model_dir, tmp_path / name, storage, tracking, "--study-name", "shared", "--n-trials", "4", "--seed", str(i))
        for i, name in enumerate(("w1", "w2"))
    ]
    outputs = [w.communicate(timeout=800) for w in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
        assert "unused-secret" not in out + err  # the password never reaches a log
    summaries = [json.loads((tmp_path / n / "summary.json").read_text()) for n in ("w1", "w2")]
    assert summaries[0]["mlflow_parent_run_id"] == summaries[1]["mlflow_parent_run_id"]

    study = optuna.load_study(study_name="shared", storage=storage)
    finished = study.get_trials(states=FINISHED)
    # Each worker stops once the study holds 4 finished trials; one may be mid-trial then.
    assert 4 <= len(finished) <= 5
    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name("hpo-lora")
    parents = client.search_runs([experiment.experiment_id], filter_string="tags.`hpo.role` = 'study'")
    assert [p.info.run_id for p in parents] == [summaries[0]["mlflow_parent_run_id"]]
    children = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'"
    )
    numbers = sorted(int(r.data.tags["hpo.trial_number"]) for r in children)
    assert numbers == sorted(t.number for t in study.trials)  # every trial exactly once
    preset = json.loads((tmp_path / "w1" / "summary.json").read_text())["preset_path"]
    assert "unused-secret" not in Path(preset).read_text()


@pytest.mark.timeout(900)
def test_a_dead_workers_trial_is_failed_and_retried(postgres: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    storage, tracking = _database(postgres, "optuna_b"), _database(postgres, "mlflow_b")
    beat = ("--heartbeat-seconds", "1", "--grace-seconds", "4", "--study-name", "crash")
    # Three epochs at fraction 1.0: a trial of many seconds, so it is surely mid-training when killed.
    doomed = _worker(
        tiny_model_dir, tmp_path / "doomed", storage, tracking, *beat, "--n-trials", "3",
        "--trial-fraction", "1.0", "--epochs", "3",
    )  # fmt: skip
    deadline = time.monotonic() + 300
    running: list[optuna.trial.FrozenTrial] = []
    client = MlflowClient(tracking_uri=tracking)
    while True:  # until a trial runs and its MLflow run exists; then kill at once
        assert doomed.poll() is None, doomed.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the first worker never started a trial"
        time.sleep(0.5)
        try:
            study = optuna.load_study(study_name="crash", storage=storage)
        except KeyError:
            continue
        running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
        experiment = client.get_experiment_by_name("hpo-lora")
        if not running or experiment is None:
            continue
        number = running[0].number
        if client.search_runs([experiment.experiment_id], filter_string=f"tags.`hpo.trial_number` = '{number}'"):
            break
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.communicate()
    time.sleep(5)  # past the grace period: the heartbeat has stopped

    survivor = _worker(tiny_model_dir, tmp_path / "survivor", storage, tracking, *beat, "--n-trials", "3")
    out, err = survivor.communicate(timeout=800)
    assert survivor.returncode == 0, err[-3000:]
    study = optuna.load_study(study_name="crash", storage=storage)
    dead = study.trials[running[0].number]
    assert dead.state == optuna.trial.TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retried and retried[0].params == dead.params
    experiment = client.get_experiment_by_name("hpo-lora")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`hpo.trial_number` = '{dead.number}'")
    assert len(runs) == 1
    assert runs[0].data.tags["state"] == "failed" and runs[0].info.status == "FAILED"


def test_two_writers_inserting_one_param_at_once_both_go_on(
    postgres: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A CI run (2026-11-27) lost a worker so: both first sessions logged search_plan.* on the
    # shared parent run at one moment; MLflow's check saw neither, PostgreSQL's key refused
    # the second insert, and that worker's study exited 1. Here the other writer's insert is
    # held open in a transaction until MLflow's insert waits on it, then committed.
    import threading

    from common.mlflow_store import metric
    from common.mlflow_writer import MlflowWriter

    tracking = _database(postgres, "mlflow_race")
    writer = MlflowWriter(tracking)
    experiment = writer.experiment("race", artifact_dir=str(tmp_path / "art"))
    run_id = writer.create_run(experiment, run_name="parent", tags={})
    writer.flush()
    database = tracking.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(database) as other, psycopg.connect(database, autocommit=True) as watch:
        other.execute("INSERT INTO params (key, value, run_uuid) VALUES ('plan.source', 'other', %s)",
                      (run_id,))  # fmt: skip
        failures: list[BaseException] = []

        def log() -> None:
            try:
                writer.log_batch(run_id, metrics=[metric("m", 1.0, 0)],
                                 params={"plan.source": "none", "plan.new": 4})  # fmt: skip
                writer.flush()
            except BaseException as exc:  # the assertion below shows it
                failures.append(exc)

        thread = threading.Thread(target=log)
        thread.start()
        deadline = time.monotonic() + 60
        while not watch.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'INSERT INTO params%'"
        ).fetchall():
            assert time.monotonic() < deadline, "MLflow's insert never waited on the other's"
            time.sleep(0.05)
        other.commit()
        thread.join(timeout=60)
    assert not thread.is_alive() and not failures, failures
    data = MlflowClient(tracking).get_run(run_id).data
    assert data.params == {"plan.source": "other", "plan.new": "4"}  # the first value kept
    assert data.metrics == {"m": 1.0}
    (said,) = [r.getMessage() for r in caplog.records if r.name == "common.mlflow_store"]
    assert "plan.source" in said and "plan.new" not in said
