"""A real `mlflow server` over HTTP goes away and comes back: nothing lost, nothing twice."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient

from common.errors import BadInputError
from common.mlflow_replay import replay
from common.mlflow_store import CLIENT_ID_PREFIX, CLIENT_ID_TAG, metric
from common.mlflow_writer import MlflowWriter, drain
from common.outage import TrackingUnreachable, answers
from common.spool import REJECTED, Spool, spool_folders
from hpo.config import load_config
from hpo.runner import run_study
from hpo.states import STATE_NAMES
from tests.cli import run_module
from tests.configs import short_study
from tests.servers import MlflowServer, free_port
from trainers.events import EvalInfo, StepInfo
from trainers.tracking import MlflowRun


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_unreachable_server_at_start_is_one_line_within_seconds(tmp_path: Path) -> None:
    url = f"http://alice:hunter2@127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingUnreachable) as caught:
        MlflowWriter(url).experiment("nobody-answers")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert message == (
        f"MLflow tracking server {url.replace('hunter2', '***')} does not answer "
        "(connection refused)"
    )
    assert isinstance(caught.value, BadInputError)  # exit 2 on the command line


def test_writer_spools_while_the_server_is_away_and_sends_once(
    tracking_server: MlflowServer, tmp_path: Path
) -> None:
    writer = MlflowWriter(tracking_server.url, spool_root=tmp_path / "spool", backoff=(0.2, 1.0))
    experiment = writer.experiment("outage")
    before = writer.create_run_later(experiment, run_name="before", tags={"k": "v"})
    writer.log_batch(before, metrics=[metric("loss", 1.0 / (i + 1), i) for i in range(5)])
    writer.flush()
    assert writer.waiting == 0 and writer.spool_folder is None

    tracking_server.stop(kill=True)
    started = time.monotonic()
    writer.log_batch(before, metrics=[metric("loss", 1.0 / (i + 1), i) for i in range(5, 10)])
    during = writer.create_run_later(experiment, run_name="during", tags={})
    writer.log_batch(during, metrics=[metric("loss", 2.0, s) for s in range(3)], params={"a": 1})
    writer.set_terminated(during, "FINISHED")
    writer.set_terminated(before, "KILLED")
    writer.flush()
    assert time.monotonic() - started < 10  # no stall: the records wait on disk
    assert writer.waiting == 5 and during.result().startswith("hpo-run-")
    assert writer.spool_folder is not None and (writer.spool_folder / "records.jsonl").exists()

    tracking_server.start()
    deadline = time.monotonic() + 30
    while writer.waiting and time.monotonic() < deadline:
        time.sleep(0.2)  # the back-off timer finds the server back without new writes
    assert writer.waiting == 0
    assert writer.close() == 0
    assert not spool_folders(tmp_path / "spool")  # an empty spool is removed

    client = MlflowClient(tracking_server.url)
    runs = client.search_runs([experiment])
    assert sorted(r.info.run_name for r in runs) == ["before", "during"]
    by_name = {r.info.run_name: r for r in runs}
    assert by_name["before"].info.status == "KILLED"
    assert by_name["during"].info.status == "FINISHED"
    assert by_name["during"].data.params == {"a": "1"}
    before_id = by_name["before"].info.run_id
    assert _history(client, before_id, "loss") == [(i, 1.0 / (i + 1)) for i in range(10)]
    assert _history(client, by_name["during"].info.run_id, "loss") == [(s, 2.0) for s in range(3)]


def test_replay_sends_a_left_spool_once_even_when_a_create_had_reached_the_server(
    tracking_server: MlflowServer, tmp_path: Path
) -> None:
    writer = MlflowWriter(tracking_server.url, spool_root=tmp_path / "spool", backoff=(60.0, 60.0))
    experiment = writer.experiment("replay")
    # A run whose creation reached the server; the reply is lost, so it is spooled too.
    reached = writer.create_run_later(experiment, run_name="reached", tags={}).result()
    client_id = client_tag = (
        MlflowClient(tracking_server.url).get_run(reached).data.tags[CLIENT_ID_TAG]
    )
    tracking_server.stop(kill=True)
    writer.log_batch(reached, metrics=[metric("x", 1.0, 0)])  # the outage opens the spool
    writer.flush()
    assert writer.spool is not None
    record = {
        "op": "create_run",
        "client_id": client_tag,
        "experiment_id": experiment,
        "run_name": "reached",
        "tags": {},
        "start_time": 0,
        "adopt": None,
    }
    writer.submit(writer._to_spool, record).result()
    writer.log_batch(client_id, metrics=[metric("x", 2.0, 1)])
    writer.flush()
    assert writer.close() == 3  # the process ends with the server still away
    folder = spool_folders(tmp_path / "spool")[0]
    assert "hunter2" not in (folder / "meta.json").read_text()

    tracking_server.start()
    command = ["hpo.tracking", "--replay", str(tmp_path / "spool")]
    done = run_module(*command, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sent 3 MLflow records; 0 still waiting" in done.stdout
    again = run_module(*command, timeout=120)
    assert again.returncode == 2 and "no MLflow spool here" in again.stderr  # removed once sent

    client = MlflowClient(tracking_server.url)
    runs = client.search_runs([experiment])
    assert [r.info.run_id for r in runs] == [reached]  # adopted, not created twice
    assert _history(client, reached, "x") == [(0, 1.0), (1, 2.0)]


def test_full_runs_mlflow_run_goes_on_across_an_outage(
    tracking_server: MlflowServer, tmp_path: Path
) -> None:
    run = MlflowRun(
        tracking_server.url,
        experiment_name="full",
        run_name="full-run",
        params={"lr": 1e-4},
        tags={"hpo.role": "full_training"},
        flush_seconds=0.0,
        spool_dir=tmp_path / "out" / "mlflow-spool",
    )
    run.writer._backoff = (0.2, 1.0)
    steps = 12
    for step in range(1, steps + 1):
        if step == 5:
            run.writer.flush()
            tracking_server.stop(kill=True)
        if step == 9:
            tracking_server.start()
        run.on_step(StepInfo(step, steps, 2.0 - step / 100, 1e-4, 0.5, 100, 0.5 * step))
        if step % 4 == 0:
            run.on_eval(EvalInfo(step, 1.9 - step / 100, 0.1))
    run.on_checkpoint(steps, "ckpt", 0.5)
    run.end("FINISHED")
    run.attach_report({"estimate": {"final_val_loss": {"p50": 1.8}}})
    assert run.writer.spooled > 0  # the outage was real
    assert run.close() == 0

    client = MlflowClient(tracking_server.url)
    stored = client.get_run(run.run_id)
    assert stored.info.status == "FINISHED"
    assert [s for s, _ in _history(client, run.run_id, "train_loss")] == list(range(1, 13))
    assert [s for s, _ in _history(client, run.run_id, "val_loss")] == [4, 8, 12]
    assert stored.data.metrics["predicted_final_val_loss_p50"] == 1.8
    assert stored.data.metrics["checkpoint_time_s"] == 0.5
    assert [a.path for a in client.list_artifacts(run.run_id)] == ["result.json"]


def _study_config(
    tiny_model_dir: Path, tmp_path: Path, url: str, name: str, n_trials: int, **extra: Any
) -> Any:
    values = {
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
        "study_name": name,
        "n_trials": n_trials,
        "tracking_uri": url,
        "experiment_name": f"{name}-exp",
        # Sampled often, so that every trial has readings to lose or to keep.
        "system_metrics_seconds": 0.5,
    }
    return short_study(tmp_path / "work", tiny_model_dir, {**values, **extra})


def _finished(config: Any) -> int:
    """Trials of the study that are over (0 before the study exists)."""
    try:
        study = optuna.load_study(study_name=config.study_name, storage=config.storage_url)
    except Exception:  # not created yet (or its tables being created right now)
        return 0
    return sum(t.state in STATE_NAMES for t in study.get_trials(deepcopy=False))


def _when_finished(config: Any, count: int, action: Any) -> threading.Thread:
    """Run `action()` on a thread once `count` trials of the study are over."""

    def watch() -> None:
        while _finished(config) < count:
            time.sleep(0.2)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _span(trial: optuna.trial.FrozenTrial) -> tuple[float, float]:
    """When a trial started and ended (seconds since the epoch), from the study's records."""
    assert trial.datetime_start is not None and trial.datetime_complete is not None
    return trial.datetime_start.timestamp(), trial.datetime_complete.timestamp()


def _check_runs(client: MlflowClient, summary: Any, trials: list[Any]) -> None:
    """Every trial exactly one closed child run with its whole curve and its system readings."""
    children = client.search_runs(
        [summary.mlflow_experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{summary.mlflow_parent_run_id}'",
    )
    numbers = sorted(int(r.data.tags["hpo.trial_number"]) for r in children)
    assert numbers == [t.number for t in trials]  # every trial exactly one child run
    for child in children:
        trial = trials[int(child.data.tags["hpo.trial_number"])]
        assert child.data.tags["state"] == STATE_NAMES[trial.state]
        assert child.info.status != "RUNNING"
        steps = [s for s, _ in _history(client, child.info.run_id, "train_loss")]
        assert steps == list(range(1, int(trial.user_attrs["trained_steps"]) + 1))
        assert trial.user_attrs["mlflow_run_id"] in (
            child.info.run_id,
            child.data.tags[CLIENT_ID_TAG],
        )
        # Sampled during the outage too: the readings waited with the trial's other records.
        assert "system/cpu_utilization_percentage" in child.data.metrics, trial.number
    parent = client.get_run(summary.mlflow_parent_run_id)
    assert parent.info.status == "FINISHED"
    counts = {
        k.removeprefix("n_"): int(v) for k, v in parent.data.metrics.items() if k.startswith("n_")
    }
    assert counts == {k: v for k, v in summary.states.items() if k in counts}
    assert sum(counts.values()) == len(trials)


@pytest.mark.timeout(600)
def test_study_goes_on_while_the_server_is_killed_and_restarted(
    tracking_server: MlflowServer,
    tiny_model_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _study_config(
        tiny_model_dir, tmp_path, tracking_server.url, "outage", 5, tracking_exit_wait_seconds=120
    )
    outage: dict[str, float] = {}

    def kill_and_restart() -> None:
        # Killed once the first trial is in; started again at once (that takes seconds).
        tracking_server.stop(kill=True)
        outage["killed_at"] = _finished(config)
        time.sleep(3)
        tracking_server.start()
        outage["back_at"] = _finished(config)

    watcher = _when_finished(config, 1, kill_and_restart)
    with caplog.at_level(logging.WARNING):
        summary = run_study(config, progress=False)
    watcher.join(timeout=180)
    assert outage["killed_at"] < 5 and summary.tracking_spool is not None  # spooled mid-study
    # The server answered before the study exited: everything was sent, nothing left behind.
    assert summary.tracking_records_waiting == 0
    assert not spool_folders(Path(summary.tracking_spool).parent)
    assert "--replay" not in caplog.text

    study = optuna.load_study(study_name="outage", storage=config.storage_url)
    trials = study.get_trials()
    assert len(trials) == 5
    _check_runs(MlflowClient(tracking_server.url), summary, trials)
    assert "tracking_records_waiting" in json.loads(json.dumps(summary.to_dict()))


@pytest.mark.timeout(600)
def test_a_server_that_stops_answering_for_good_costs_the_study_no_speed(
    tracking_server: MlflowServer,
    tiny_model_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped (SIGSTOP), the server takes connections and never answers: the worst outage.

    Every write to it waits for MLflow's HTTP timeout (30 s), so a trial that waited for
    the tracking server would take up to that much longer (MLflow's own system-metrics
    monitor did: it asks the server for the run every sample and is joined at the end).
    """
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")  # the writer's default
    config = _study_config(
        tiny_model_dir, tmp_path, tracking_server.url, "silent", 6, tracking_exit_wait_seconds=3
    )
    outage: dict[str, float] = {}

    def stop_for_good() -> None:
        assert tracking_server.proc is not None
        os.killpg(tracking_server.proc.pid, signal.SIGSTOP)
        outage["at"] = time.time()

    watcher = _when_finished(config, 3, stop_for_good)
    try:
        with caplog.at_level(logging.WARNING):
            summary = run_study(config, progress=False)
        watcher.join(timeout=10)
        study = optuna.load_study(study_name="silent", storage=config.storage_url)
        trials = study.get_trials()
        assert len(trials) == 6 and "at" in outage
        # Per-trial wall time from the study's own records, before and during the outage.
        spans = {t.number: _span(t) for t in trials}
        seconds = {n: end - start for n, (start, end) in spans.items()}
        # Trial 0 also loads the base model and the data (later trials reuse them): left out.
        before = [seconds[n] for n, (_, end) in spans.items() if n > 0 and end < outage["at"]]
        during = [seconds[n] for n, (start, _) in spans.items() if start > outage["at"]]
        assert len(before) >= 2 and len(during) >= 2, (before, during)
        # 1.5x with 2 s of slack for tiny trials on a shared machine; a trial that waited
        # for the server once would take up to the HTTP timeout (30 s) longer.
        assert statistics.median(during) <= 1.5 * statistics.median(before) + 2.0, seconds

        # Every record sent or waiting, named: the spool holds them, the log says how to send.
        waiting = summary.tracking_records_waiting
        assert waiting > 0 and summary.tracking_spool is not None
        folder = Path(summary.tracking_spool)
        spool = Spool(folder)
        assert spool.waiting == waiting and len(list(spool.pending())) == waiting
        spool.close(remove_if_done=False)
        lines = caplog.text.splitlines()
        assert any("waiting up to 3 s for it to answer before exiting" in x for x in lines)
        assert any(f"python -m hpo.tracking --replay {folder}" in x for x in lines)
    finally:
        tracking_server.stop(kill=True)  # SIGKILL ends a stopped process too
    tracking_server.start()
    assert replay(folder.parent) == (waiting, 0)
    _check_runs(MlflowClient(tracking_server.url), summary, trials)


def test_spool_keeps_order_and_survives_a_cut_line(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", tracking_uri="http://bob:pw@host:5000")
    for i in range(3):
        spool.append({"op": "log_batch", "i": i})
    spool.mark_sent()
    with pytest.raises(Exception, match="in use"):
        Spool(tmp_path / "s")  # one process at a time
    spool.close(remove_if_done=False)
    with (tmp_path / "s" / "records.jsonl").open("a") as handle:
        handle.write('{"op": "log_ba')  # the process died mid-line: that record never was
    again = Spool(tmp_path / "s")
    assert [r["i"] for r in again.pending()] == [1, 2] and again.waiting == 2
    assert again.tracking_uri == "http://bob:***@host:5000"
    again.close()


def _offline_config(tiny_model_dir: Path, tmp_path: Path, url: str, outage: str) -> Any:
    values = {
        "study_name": "offline",
        "tracking_uri": url,
        "experiment_name": "offline-exp",
        "tracking_outage": outage,
        "tracking_exit_wait_seconds": 0,  # away for good: sent later by a replay
    }
    return short_study(tmp_path / "work", tiny_model_dir, values)


@pytest.mark.timeout(600)
def test_a_study_started_while_the_server_is_away_is_sent_later(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    server = MlflowServer(tmp_path / "late-server")
    server.root.mkdir()
    refused = _offline_config(tiny_model_dir, tmp_path, server.url, "fail")
    started = time.monotonic()
    with pytest.raises(TrackingUnreachable, match="pass --tracking-outage spool") as caught:
        run_study(refused, progress=False)
    assert time.monotonic() - started < 60 and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"MLflow tracking server {server.url} does not answer")

    summary = run_study(
        _offline_config(tiny_model_dir, tmp_path, server.url, "spool"), progress=False
    )
    assert summary.states["complete"] + summary.states["pruned"] == 1
    assert summary.tracking_records_waiting > 0 and summary.tracking_spool is not None
    server.start()
    try:
        sent, waiting = replay(Path(summary.tracking_spool).parent)
        assert (sent, waiting) == (summary.tracking_records_waiting, 0)
        client = MlflowClient(server.url)
        experiment = client.get_experiment_by_name("offline-exp")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        parents = [r for r in runs if r.data.tags.get("hpo.role") == "study"]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        children = [
            r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
        ]
        assert [int(r.data.tags["hpo.trial_number"]) for r in children] == [0]
        assert len(runs) == 2
        for child in children:
            assert child.info.status != "RUNNING"
            assert _history(client, child.info.run_id, "train_loss")
    finally:
        server.stop(kill=True)


def test_a_record_the_store_refuses_is_kept_aside_and_the_rest_goes_on(tmp_path: Path) -> None:
    writer = MlflowWriter(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = writer.experiment("refused", artifact_dir=str(tmp_path / "art"))
    spool = Spool(tmp_path / "spool", tracking_uri=writer.tracking_uri)
    run = {"op": "create_run", "client_id": "hpo-run-a", "experiment_id": experiment}
    spool.append({**run, "run_name": "a", "tags": {}, "start_time": 1, "adopt": None})
    batch = {"params": {}, "tags": {}, "metrics": [["x", 1.0, 2, 0]]}
    spool.append({"op": "log_batch", "run": "no-such-run", **batch})
    spool.append({"op": "log_batch", "run": "hpo-run-a", **batch})
    spool.append({"op": "terminate", "run": "hpo-run-a", "status": "FINISHED", "end_time": 3})

    assert drain(writer, spool) == (4, None) and spool.waiting == 0
    rejected = [json.loads(line) for line in (spool.folder / REJECTED).read_text().splitlines()]
    assert [r["run"] for r in rejected] == ["no-such-run"] and rejected[0]["error"]
    stored = writer.client.get_run(spool.ids["hpo-run-a"])
    assert stored.info.status == "FINISHED" and stored.data.metrics == {"x": 1.0}
    assert stored.data.tags[CLIENT_ID_TAG] == "hpo-run-a"
    spool.close()
    assert (spool.folder / REJECTED).exists()  # kept for a reader, not removed with the spool


def test_a_silent_server_is_found_out_in_seconds() -> None:
    """A server that takes connections and never answers costs a probe its timeout, no more."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections wait in the backlog: nobody ever answers them
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        assert not answers(url, timeout=0.5)
        assert time.monotonic() - started < 5
    assert answers("sqlite:///anywhere.db")  # a local store has no server to wait for


def test_a_negative_exit_wait_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="tracking_exit_wait_seconds must be >= 0"):
        load_config(None, {"work_dir": str(tmp_path), "tracking_exit_wait_seconds": -1})


@pytest.mark.timeout(300)
def test_trial_runs_left_open_offline_are_closed_once_the_server_answers(tmp_path: Path) -> None:
    from hpo.tracking import Tracker

    server = MlflowServer(tmp_path / "late")
    server.root.mkdir()
    tracker = Tracker(server.url, "late-exp", spool_dir=tmp_path / "spool", outage="spool")
    assert tracker.offline  # its experiment and parent run have client-side ids for now
    study = optuna.create_study(study_name="late")
    parent = tracker.ensure_parent(study, {"n_trials": 1})
    trial = study.ask()
    tracker.start_trial(parent, "late", trial.number, {"lr": 0.1})  # its worker died
    study.tell(trial, 1.0)
    assert tracker.reconcile(parent, study) == 0  # the server is away: tried at the close
    server.start()
    try:
        # The spool goes first; the open run is then looked for by the store's own ids.
        assert tracker.finish_parent(parent, exit_wait_seconds=60) == 0
        client = MlflowClient(server.url)
        experiment = client.get_experiment_by_name("late-exp")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        (child,) = [r for r in runs if r.data.tags.get("hpo.role") != "study"]
        assert child.data.tags["state"] != "running" and child.info.status == "FINISHED"
    finally:
        server.stop(kill=True)


def test_a_worker_whose_server_stops_as_it_starts_goes_on_and_its_records_arrive(
    tracking_server: MlflowServer, tmp_path: Path
) -> None:
    """The server answered the worker's experiment, then was killed before its parent run:
    the worker neither fails nor makes a second parent, and what it meant to write arrives."""
    from hpo.tracking import Tracker

    url = tracking_server.url
    study = optuna.create_study(study_name="starting")
    first = Tracker(url, "starting-exp", spool_dir=tmp_path / "s1")
    parent = first.ensure_parent(study, {"n_trials": 2})
    first.flush()
    client = MlflowClient(url)
    client.set_terminated(parent, "FINISHED")  # an earlier session of the study ended
    joining = Tracker(url, "starting-exp", spool_dir=tmp_path / "s2")
    fresh = optuna.create_study(study_name="fresh")
    founding = Tracker(url, "starting-exp", spool_dir=tmp_path / "s3")
    assert not joining.offline and not founding.offline

    tracking_server.stop(kill=True)
    started = time.monotonic()
    assert joining.ensure_parent(study, {"n_trials": 2}) == parent
    waiting = founding.ensure_parent(fresh, {"n_trials": 3})
    joining.flush()
    founding.flush()
    assert time.monotonic() - started < 20  # refused at once: no HTTP timeout
    assert waiting.startswith(CLIENT_ID_PREFIX)
    assert joining.writer.waiting == 1 and founding.writer.waiting >= 2

    tracking_server.start()
    deadline = time.monotonic() + 60
    while (joining.writer.waiting or founding.writer.waiting) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert joining.writer.waiting == 0 and founding.writer.waiting == 0
    assert client.get_run(parent).info.status == "RUNNING"  # reopened, as at any start
    experiment = client.get_experiment_by_name("starting-exp")
    assert experiment is not None
    parents = {
        name: client.search_runs(
            [experiment.experiment_id], filter_string=f"tags.`hpo.study_name` = '{name}'"
        )
        for name in ("starting", "fresh")
    }
    assert [r.info.run_id for r in parents["starting"]] == [parent]
    (made,) = parents["fresh"]
    assert made.data.params == {"n_trials": "3"} and made.data.tags["hpo.role"] == "study"
    for tracker, run in ((joining, parent), (founding, waiting)):
        assert tracker.finish_parent(run, exit_wait_seconds=60) == 0


def test_a_resumed_full_run_whose_server_is_away_stops_and_later_continues_its_run(
    tracking_server: MlflowServer, tmp_path: Path
) -> None:
    """No answer about the earlier run is not "no such run": the resume stops in one line
    instead of starting a second run, and continues the first once the server is back."""
    settings: dict[str, Any] = {
        "experiment_name": "resumed",
        "run_name": "full-run",
        "params": {"lr": 1e-4},
        "tags": {"hpo.role": "full_training"},
        "spool_dir": tmp_path / "spool",
    }
    first = MlflowRun(tracking_server.url, **settings)
    first.end("KILLED")  # the machine went away mid-run
    first.close()

    tracking_server.stop(kill=True)
    for earlier in (first.run_id, None):  # a resume, and a fresh run of the study's parent
        with pytest.raises(TrackingUnreachable) as caught:
            MlflowRun(
                tracking_server.url, continue_run_id=earlier, parent_run_id=first.run_id, **settings
            )
        assert str(caught.value).endswith("pass --tracking-uri off to train without MLflow")
        assert "\n" not in str(caught.value)

    tracking_server.start()
    resumed = MlflowRun(tracking_server.url, continue_run_id=first.run_id, **settings)
    try:
        assert resumed.continued and resumed.run_id == first.run_id
    finally:
        resumed.end("FINISHED")
        resumed.close()
    client = MlflowClient(tracking_server.url)
    experiment = client.get_experiment_by_name("resumed")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == first.run_id and run.info.status == "FINISHED"
