"""The web views beside the report: `make ui` (MLflow) and optuna-dashboard, really served."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.report_study import build_study
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start `command` in a process group of its own, output to `log` (a pipe could fill up)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, seconds: float = 120) -> int:
    """The HTTP status of `url` once it answers (the process must stay up meanwhile)."""
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status)
        except OSError:
            assert time.monotonic() < deadline, f"{url} did not answer within {seconds} s"
            time.sleep(0.3)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group this test started (make + its server)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_optuna_dashboard_serves_the_study(tmp_path: Path) -> None:
    # The one skip in the report's tests: optuna-dashboard is the optional [dashboard] extra.
    pytest.importorskip("optuna_dashboard", reason="the [dashboard] extra is not installed")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    build_study(storage, "dashboard", layout=["complete", "pruned", "never_trained"])
    port = free_port()
    command = Path(sys.executable).with_name("optuna-dashboard")
    log = tmp_path / "dashboard.log"
    proc = _start([str(command), storage, "--host", "127.0.0.1", "--port", str(port)], log)
    try:
        base = f"http://127.0.0.1:{port}"
        assert _wait_for(f"{base}/dashboard", proc, log) == 200
        with urllib.request.urlopen(f"{base}/api/studies", timeout=30) as response:
            assert b'"dashboard"' in response.read()
    finally:
        _stop(proc)


def test_make_ui_serves_mlflow_and_prints_the_runs_view(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = MlflowClient(tracking_uri=store).create_experiment("hpo-lora")
    port = free_port()
    # -o: never rebuild the virtual environment from inside a test.
    log = tmp_path / "make-ui.log"
    command = ["make", "-s", "-o", ".venv/.installed-stamp", "ui", f"PY={sys.executable}",
               f"UI_PORT={port}", f"UI_STORE={store}"]  # fmt: skip
    proc = _start(command, log)
    try:
        assert _wait_for(f"http://127.0.0.1:{port}/health", proc, log) == 200
        first = log.read_text().splitlines()[0]
        url = (
            f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs?workflowType=machine_learning"
        )
        assert url in first, first
    finally:
        _stop(proc)
