"""Local workers: GPU assignment, the SQLite refusal, dead workers on SQLite and journal."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from mlflow import MlflowClient

from common.errors import BadInputError
from hpo.keys import PROMOTED_FROM_ATTR, WORKER_ATTR
from hpo.states import trial_loss
from hpo.storage import make_storage
from hpo.workers import (
    WORKER_INDEX_ENV,
    WorkerId,
    fail_dead_workers_trials,
    gpu_assignment,
    idle_gpus_hint,
)
from tests.cli import run_module, start_module

RUNNING = optuna.trial.TrialState.RUNNING
FAIL = optuna.trial.TrialState.FAIL
COMPLETE = optuna.trial.TrialState.COMPLETE


@pytest.mark.parametrize(
    ("n_workers", "gpus", "expected"),
    [
        (1, [], [None]),
        (3, [], [None, None, None]),  # CPU: every worker trains on the CPU
        (2, ["0", "1", "2", "3"], ["0", "1"]),
        (4, ["0", "1", "2", "3"], ["0", "1", "2", "3"]),
        (2, ["5", "7"], ["5", "7"]),  # the ids CUDA_VISIBLE_DEVICES allowed, in order
        (1, ["GPU-8f2c"], ["GPU-8f2c"]),  # UUIDs pass through
    ],
)
def test_one_gpu_per_worker(n_workers: int, gpus: list[str], expected: list[str | None]) -> None:
    assert gpu_assignment(n_workers, gpus) == expected


@pytest.mark.parametrize(
    ("n_workers", "gpus", "expected"), [(3, ["0", "1"], "2 GPU"), (0, [], "workers")]
)
def test_gpu_assignment_refuses(n_workers: int, gpus: list[str], expected: str) -> None:
    with pytest.raises(BadInputError, match=expected):
        gpu_assignment(n_workers, gpus)


def test_a_study_on_one_of_several_gpus_says_how_to_use_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A one-worker study on a host with several GPUs trains on one and leaves the rest idle:
    it says which `--workers` (and, over SQLite, which shared storage) would use them all."""
    from hpo.workers import _worker_argv

    monkeypatch.delenv(WORKER_INDEX_ENV, raising=False)
    journal = str(tmp_path / "optuna.journal")
    sqlite = f"sqlite:///{tmp_path / 'optuna.db'}"
    hint = idle_gpus_hint(["2", "3", "5", "6"], 1, sqlite, journal)
    assert "4 GPUs (2,3,5,6)" in hint and "on GPU 2" in hint
    assert f"--workers 4 --storage journal:{journal} trains 4 at once" in hint
    assert "stays in SQLite" in hint
    # The storage it suggests is one the workers can share: --workers accepts it.
    flags = hint.split(": ", 1)[1].split(" trains")[0].split()
    assert flags[flags.index("--workers") + 1] == "4"
    from hpo.storage import shared_by_processes

    assert shared_by_processes(flags[flags.index("--storage") + 1])
    # A shared storage already: --workers alone.
    shared = idle_gpus_hint(["0", "1"], 1, f"journal:{journal}", journal)
    assert "--workers 2 trains 2 at once" in shared and "--storage" not in shared
    assert "--workers" not in _worker_argv(["--workers", "2", "--data", "d"], 0)
    # Nothing to say: one GPU, none (a CPU), --workers given, or a worker --workers started.
    assert idle_gpus_hint(["0"], 1, sqlite, journal) == ""
    assert idle_gpus_hint([], 1, sqlite, journal) == ""
    assert idle_gpus_hint(["0", "1"], 2, sqlite, journal) == ""
    monkeypatch.setenv(WORKER_INDEX_ENV, "0")
    assert idle_gpus_hint(["0", "1"], 1, sqlite, journal) == ""


def test_the_fingerprint_is_per_gpu_kind() -> None:
    """A worker's hardware fingerprint names the GPU it sees, not which index or how many."""
    from analysis.timemodel.hardware import HardwareInfo, fingerprint
    from analysis.timemodel.model import ModelProfile

    model = ModelProfile(total_parameters=10**6, n_layers=2, hidden_size=64, vocab_size=512,
                         lora_parameters_per_rank=256)  # fmt: skip
    h100 = HardwareInfo("cuda", "NVIDIA H100 80GB HBM3", 80 * 2**30, 16, "bf16")
    a10 = dataclasses.replace(h100, device_name="NVIDIA A10G", memory_bytes=24 * 2**30)
    # Every worker of an 8-GPU H100 host shares one calibration, whatever cores it has.
    assert fingerprint(h100, model) == fingerprint(dataclasses.replace(h100, cpu_cores=2), model)
    assert fingerprint(h100, model) != fingerprint(a10, model)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_only_provably_dead_workers_trials_are_failed(tmp_path: Path, kind: str) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'o.log'}"
    study = optuna.create_study(study_name="s", storage=make_storage(url))
    here = WorkerId.this_process()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(alive.pid).create_time()
        owners = {
            "live": dataclasses.replace(here, pid=alive.pid, started=started),
            "dead": dataclasses.replace(here, pid=_dead_pid()),
            "pid reused": dataclasses.replace(here, pid=alive.pid, started=started - 100),
            "other host": dataclasses.replace(here, host="elsewhere", pid=_dead_pid()),
            "me": here,  # this very process: alive
        }
        numbers = {}
        for name, owner in owners.items():
            trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
            trial.set_user_attr(WORKER_ATTR, dataclasses.asdict(owner))
            numbers[name] = trial.number
        unclaimed = study.ask().number

        failed = fail_dead_workers_trials(study)

        assert sorted(failed) == sorted([numbers["dead"], numbers["pid reused"]])
        trials = study.get_trials()
        for name, number in numbers.items():
            expected = FAIL if name in ("dead", "pid reused") else RUNNING
            assert trials[number].state == expected, name
        assert trials[unclaimed].state == RUNNING
        assert "died" in trials[numbers["dead"]].user_attrs["state_reason"]
        retried = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
        assert sorted(t.system_attrs["failed_trial"] for t in retried) == sorted(failed)
        assert all(t.params == trials[t.system_attrs["failed_trial"]].params for t in retried)
        assert fail_dead_workers_trials(study) == []  # a second look finds nothing new
    finally:
        alive.kill()
        alive.wait()


def _study_args(tiny_model_dir: Path, work: Path, *extra: str) -> list[str]:
    """The arguments of `python -m hpo.study` for these tests' study `w`."""
    return [
        "--no-progress", "--model", str(tiny_model_dir),
        "--work-dir", str(work), "--trial-evals", "2", "--eval-samples", "8",
        "--profiles", "fast", "--pruner", "none", "--rungs", "none", "--study-name", "w", *extra,
    ]  # fmt: skip


def test_sqlite_refuses_several_workers(tiny_model_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    args = _study_args(tiny_model_dir, work, "--workers", "2", "--json", str(tmp_path / "s.json"))
    proc = run_module("hpo.study", *args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "postgresql://" in lines[0] and "journal:" in lines[0], lines
    assert not work.exists() and not (tmp_path / "s.json").exists()


@pytest.mark.timeout(600)
def test_a_killed_workers_trial_on_sqlite_is_failed_and_retried(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    storage, tracking = f"sqlite:///{work / 'optuna.db'}", f"sqlite:///{work / 'mlflow.db'}"
    # Three epochs at fraction 1.0: a trial of many seconds, surely mid-training when killed.
    doomed = start_module(
        "hpo.study",
        *_study_args(tiny_model_dir, work, "--n-trials", "2", "--trial-fraction", "1.0", "--epochs", "3"),
        stdout=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while True:  # until a trial runs and its MLflow run exists; then kill at once
        assert doomed.poll() is None, doomed.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the worker never started a trial"
        time.sleep(0.5)
        try:
            running = optuna.load_study(study_name="w", storage=storage).get_trials(
                states=(RUNNING,)
            )
        except Exception:  # tables not created yet
            continue
        if running and WORKER_ATTR in running[0].user_attrs:
            # A trial runs: the worker has set up its MLflow store, this client cannot race it.
            client = MlflowClient(tracking_uri=tracking)
            experiment = client.get_experiment_by_name("hpo-lora")
            assert experiment is not None
            tag = f"tags.`hpo.trial_number` = '{running[0].number}'"
            if client.search_runs([experiment.experiment_id], filter_string=tag):
                break
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate()
    dead = running[0].number
    study = optuna.load_study(study_name="w", storage=storage)
    assert study.trials[dead].state == RUNNING  # no heartbeat: nothing else would fail it

    survivor = run_module(
        "hpo.study",
        *_study_args(tiny_model_dir, work, "--n-trials", "2", "--trial-fraction", "0.015",
                     "--json", str(tmp_path / "s.json")),
        cwd=tmp_path, timeout=500,
    )  # fmt: skip
    assert survivor.returncode == 0, survivor.stderr[-3000:]
    study = optuna.load_study(study_name="w", storage=storage)
    assert study.trials[dead].state == FAIL
    assert study.trials[dead].user_attrs[WORKER_ATTR]["pid"] == doomed.pid
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead]
    assert retried and retried[0].params == study.trials[dead].params
    assert retried[0].user_attrs[WORKER_ATTR]["pid"] != doomed.pid
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`hpo.trial_number` = '{dead}'"
    )
    assert len(runs) == 1
    assert runs[0].data.tags["state"] == "failed" and runs[0].info.status == "FAILED"
    assert not [t for t in study.trials if t.state == RUNNING]


@pytest.mark.timeout(600)
def test_two_local_workers_share_a_journal_study(tiny_model_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    storage = f"journal:{work / 'optuna.journal'}"
    args = _study_args(
        tiny_model_dir, work, "--workers", "2", "--n-trials", "3", "--trial-fraction", "0.015",
        "--promote", "1", "--promote-fraction", "0.03",
        "--storage", storage, "--json", str(tmp_path / "s.json"),
    )  # fmt: skip
    proc = run_module("hpo.study", *args, cwd=tmp_path, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    pids = [int(line.split("pid ")[1].split(",")[0]) for line in proc.stdout.splitlines()
            if line.startswith("worker ")]  # fmt: skip
    assert len(pids) == 2
    study = optuna.load_study(study_name="w", storage=make_storage(storage))
    finished = [t for t in study.trials if t.state.is_finished()]
    firsts = [t for t in study.trials if PROMOTED_FROM_ATTR not in t.user_attrs]
    assert 3 <= len(firsts) <= 4  # a worker may be mid-trial when the study is full
    # The launcher promotes once all workers have ended: one promotion of the best.
    (promoted,) = [t for t in study.trials if PROMOTED_FROM_ATTR in t.user_attrs]
    assert promoted.state == COMPLETE
    assert promoted.user_attrs[WORKER_ATTR]["pid"] not in pids
    best = min((t for t in firsts if t.state == COMPLETE), key=lambda t: trial_loss(t) or 1e9)
    assert promoted.user_attrs[PROMOTED_FROM_ATTR] == best.number
    assert promoted.params == best.params
    # Both workers ran trials, each with its own seed: no configuration twice.
    assert {t.user_attrs[WORKER_ATTR]["pid"] for t in firsts} == set(pids)
    assert len({json.dumps(t.params, sort_keys=True) for t in firsts}) == len(firsts)
    summary = json.loads((tmp_path / "s.json").read_text())
    assert sum(summary["states"].values()) == len(finished)
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    children = client.search_runs(
        [summary["mlflow_experiment_id"]],
        filter_string=f"tags.mlflow.parentRunId = '{summary['mlflow_parent_run_id']}'",
    )
    numbers = sorted(int(r.data.tags["hpo.trial_number"]) for r in children)
    assert numbers == sorted(t.number for t in firsts)  # every trial exactly once
    continued = [r for r in children if r.info.run_id == best.user_attrs["mlflow_run_id"]]
    assert continued[0].data.tags["hpo.promoted_trial_number"] == str(promoted.number)
    assert os.path.exists(work / "workers" / "worker-1.log")
    assert socket.gethostname() == study.trials[0].user_attrs[WORKER_ATTR]["host"]


def test_a_worker_opening_a_study_another_is_still_writing_joins_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two workers starting a new study together each write its attributes, one at a time.
    A worker that reads the study between another's writes (its config stored, its model
    not yet) joins the study; a model that differs is still refused, naming it."""
    from hpo.keys import CONFIG_ATTR, DATA_ATTR, MODEL_ATTR
    from hpo.prepare import prepare
    from hpo.runner import open_study
    from tests.configs import short_study

    storage = f"journal:{tmp_path / 'optuna.journal'}"
    config = short_study(tmp_path / "work", tiny_model_dir, {"storage": storage})
    prepared = prepare(config)
    other = optuna.create_study(study_name=config.study_name, storage=make_storage(storage))
    other.set_user_attr(CONFIG_ATTR, config.to_dict())  # the other worker's first write

    study = open_study(config, prepared)
    assert study.user_attrs[MODEL_ATTR] == prepared.model_path
    assert study.user_attrs[DATA_ATTR] == prepared.data_path
    assert open_study(config, prepared).user_attrs[CONFIG_ATTR] == config.to_dict()

    other.set_user_attr(MODEL_ATTR, "/models/another")
    with pytest.raises(BadInputError, match="was started on model /models/another"):
        open_study(config, prepared)
