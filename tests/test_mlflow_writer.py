"""The one MLflow writer against a real SQLite store, the schema-race retry, the step metrics."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from common.errors import BadInputError
from common.mlflow_store import (
    MAX_METRICS_PER_CALL,
    MAX_PARAM_LENGTH,
    MAX_PARAMS_PER_CALL,
    metric,
)
from common.mlflow_writer import MlflowWriter
from common.retry import SCHEMA_RACE_ATTEMPTS, lost_schema_race, retry_schema_race
from trainers.events import EvalInfo, StepInfo
from trainers.tracking import StepMetrics

ROOT = Path(__file__).resolve().parent.parent


class FailsFirst:
    """Raises `error` on its first `failures` calls, then returns "done"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


def test_retry_wins_after_losing_the_schema_race_twice() -> None:
    slept: list[float] = []
    fn = FailsFirst(2, RuntimeError('duplicate key value violates unique constraint "pk"'))
    assert retry_schema_race(fn, sleep=slept.append) == "done"
    assert fn.calls == 3 and slept == [0.5, 1.0]


def test_retry_reraises_other_errors_at_once() -> None:
    slept: list[float] = []
    fn = FailsFirst(1, RuntimeError("connection refused"))
    with pytest.raises(RuntimeError, match="connection refused"):
        retry_schema_race(fn, sleep=slept.append)
    assert fn.calls == 1 and slept == []


def test_retry_gives_up_after_the_last_attempt() -> None:
    slept: list[float] = []
    fn = FailsFirst(100, RuntimeError('table "runs" already exists'))
    with pytest.raises(RuntimeError, match="already exists"):
        retry_schema_race(fn, sleep=slept.append)
    assert fn.calls == SCHEMA_RACE_ATTEMPTS
    assert slept == [min(2.0, 0.5 * (i + 1)) for i in range(SCHEMA_RACE_ATTEMPTS - 1)]


def test_importing_the_writer_does_not_import_mlflow() -> None:
    code = "import sys, common.mlflow_writer; assert 'mlflow' not in sys.modules"
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> MlflowWriter:
    """One real SQLite store for the module (creating its schema takes seconds)."""
    return MlflowWriter(f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")


@pytest.fixture(scope="module")
def experiment_id(writer: MlflowWriter, tmp_path_factory: pytest.TempPathFactory) -> str:
    return writer.experiment("writer-test", artifact_dir=str(tmp_path_factory.mktemp("art")))


def test_experiment_is_created_once_for_finetuning(
    writer: MlflowWriter, experiment_id: str
) -> None:
    assert writer.experiment("writer-test") == experiment_id
    experiment = writer.client.get_experiment(experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "finetuning"
    assert experiment.artifact_location.startswith("file://")


def test_writes_run_in_order_on_one_thread(writer: MlflowWriter, experiment_id: str) -> None:
    seen: list[tuple[int, str]] = []
    # The run is created in the background; writes queued behind it may name its future.
    run = writer.submit(writer.create_run, experiment_id, run_name="ordered", tags={})
    for i in range(20):
        writer.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
        writer.log_batch(run, metrics=[metric("x", float(i), i)])
    writer.set_terminated(run, "FINISHED")
    writer.flush()
    assert [i for i, _ in seen] == list(range(20))
    assert len({name for _, name in seen}) == 1
    stored = writer.client.get_run(run.result())
    assert stored.info.status == "FINISHED"
    history = writer.client.get_metric_history(run.result(), "x")
    assert sorted((m.step, m.value) for m in history) == [(i, float(i)) for i in range(20)]


def test_batches_above_mlflow_limits_are_split(
    writer: MlflowWriter, experiment_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = writer.create_run(experiment_id, run_name="chunked", tags={})
    n_metrics, n_params, n_tags = 2 * MAX_METRICS_PER_CALL + 500, 2 * MAX_PARAMS_PER_CALL + 50, 150
    calls: list[tuple[int, int, int]] = []
    original = writer.client.log_batch

    def counting(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        calls.append((len(metrics), len(params), len(tags)))
        original(run_id, metrics=metrics, params=params, tags=tags)

    monkeypatch.setattr(writer.client, "log_batch", counting)
    writer.log_batch(
        run_id,
        metrics=[metric("loss", 1.0 / (i + 1), i) for i in range(n_metrics)],
        params={f"p{i:03d}": i for i in range(n_params)},
        tags={f"t{i:03d}": i for i in range(n_tags)},
    )
    writer.flush()
    assert calls == [(1000, 100, 100), (1000, 100, 50), (500, 50, 0)]
    stored = writer.client.get_run(run_id)
    assert len(writer.client.get_metric_history(run_id, "loss")) == n_metrics
    assert len(stored.data.params) == n_params
    assert len([k for k in stored.data.tags if k.startswith("t")]) == n_tags


def test_secrets_in_param_and_tag_values_are_stored_redacted(
    writer: MlflowWriter, experiment_id: str
) -> None:
    url = "postgresql://hpo:hunter2@db:5432/optuna"
    run_id = writer.create_run(experiment_id, run_name="secret", tags={"storage": url})
    writer.log_batch(
        run_id,
        params={"storage_url": url, "long": "x" * (MAX_PARAM_LENGTH + 10), "lr": 1.23456789e-4},
        tags={"note": f"opened {url}"},
    )
    writer.flush()
    data = writer.client.get_run(run_id).data
    assert data.params["storage_url"] == "postgresql://hpo:***@db:5432/optuna"
    assert data.tags["storage"] == "postgresql://hpo:***@db:5432/optuna"
    assert data.tags["note"] == "opened postgresql://hpo:***@db:5432/optuna"
    assert len(data.params["long"]) == MAX_PARAM_LENGTH
    assert data.params["lr"] == "0.000123457"
    assert "hunter2" not in repr(data)


def test_flush_raises_the_first_queued_failure_once(writer: MlflowWriter) -> None:
    def fail() -> None:
        raise RuntimeError("store went away")

    writer.submit(fail)
    writer.log_batch("no-such-run", metrics=[metric("x", 1.0, 0)])
    with pytest.raises(RuntimeError, match="store went away"):
        writer.flush()
    writer.flush()  # reported once; the writer goes on


def test_a_store_that_cannot_be_used_is_bad_input_without_its_password() -> None:
    with pytest.raises(BadInputError) as caught:
        MlflowWriter("bogus://user:topsecret@host/db")
    message = str(caught.value)
    assert message.startswith("cannot use MLflow tracking store bogus://user:***@host/db: ")
    assert "topsecret" not in message and "\n" not in message


def test_step_metrics_buffer_and_flush_under_the_one_set_of_names(
    writer: MlflowWriter, experiment_id: str
) -> None:
    run_id = writer.create_run(experiment_id, run_name="steps", tags={})
    buffered = StepMetrics(writer, run_id, flush_seconds=3600)
    steps = MAX_METRICS_PER_CALL // 4  # four metrics a step: the last step fills one call
    for step in range(1, steps + 1):
        buffered.on_step(StepInfo(step, steps, 2.0, 1e-4, 0.5, 100, 0.5 * step))
        assert len(buffered.buffer) == (0 if step == steps else 4 * step)
    buffered.on_eval(EvalInfo(steps, 1.5, 0.1))
    assert len(buffered.buffer) == 1
    buffered.on_train_end(None)  # type: ignore[arg-type]  # the result is not read
    writer.flush()
    stored = writer.client.get_run(run_id).data.metrics
    assert stored == {
        "train_loss": 2.0,
        "tokens_per_second": 200.0,
        "step_time_s": 0.5,
        "learning_rate": 1e-4,
        "val_loss": 1.5,
    }
    assert len(writer.client.get_metric_history(run_id, "train_loss")) == steps


def test_sqlite_unique_violation_counts_as_the_race() -> None:
    # SQLite's wording, as two workers logging one dataset met it in a study of two workers.
    error = RuntimeError(
        "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
        "datasets.name, datasets.digest"
    )
    assert lost_schema_race(error)
    assert not lost_schema_race(RuntimeError("no such table: datasets"))


def test_workers_logging_one_dataset_at_once_all_get_it(tmp_path: Path) -> None:
    """Processes log the same new datasets to one experiment at the same moment: every
    run gets its input (the loser of an insert finds the winner's row on a retry)."""
    script = tmp_path / "log_inputs.py"
    script.write_text(
        "import sys, time\n"
        "from mlflow import MlflowClient\n"
        "from common.mlflow_store import MlflowStore\n"
        "uri, experiment, start = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
        "client = MlflowClient(tracking_uri=uri)\n"
        "store = MlflowStore(client, uri)\n"
        "runs = [client.create_run(experiment).info.run_id for _ in range(8)]\n"
        "time.sleep(max(0.0, start - time.time()))\n"
        "for i, run in enumerate(runs):\n"
        "    dataset = {'name': f'data-{i}', 'digest': f'd{i}', 'source_type': 'local',\n"
        "               'source': '/data.jsonl'}\n"
        "    store.send({'op': 'input', 'run': run, 'context': 'train', 'dataset': dataset})\n"
        "print(' '.join(runs))\n"
    )
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = MlflowClient(tracking_uri=uri).create_experiment("race")
    start = time.time() + 8  # both processes have imported MLflow and made their runs
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), uri, experiment, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )  # fmt: skip
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
    client = MlflowClient(tracking_uri=uri)
    for out, _ in outputs:
        for run in out.split():
            inputs = client.get_run(run).inputs.dataset_inputs
            assert [i.dataset.name for i in inputs] and len(inputs) == 1


def test_a_param_another_writer_logged_first_keeps_its_value(
    writer: MlflowWriter, experiment_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Two workers' first sessions start together and each logs its own plan on the shared
    # parent run: MLflow refuses to change a param, and that refusal must not fail the study.
    run_id = writer.create_run(experiment_id, run_name="two-sessions", tags={})
    writer.log_batch(run_id, params={"plan.hours": 0.5727, "same": "x"})
    writer.flush()
    first = writer.client.get_run(run_id).data.params["plan.hours"]
    writer.log_batch(
        run_id,
        metrics=[metric("m", 2.0, 0)],
        params={"plan.hours": 0.5719, "same": "x", "new": 3},
        tags={"plan": "second"},
    )
    writer.flush()  # nothing queued failed
    data = writer.client.get_run(run_id).data
    assert data.params["plan.hours"] == first and data.params["same"] == "x"
    assert data.params["new"] == "3" and data.tags["plan"] == "second"
    assert data.metrics["m"] == 2.0
    (said,) = [r.getMessage() for r in caplog.records if r.name == "common.mlflow_store"]
    assert "plan.hours" in said and "same" not in said
