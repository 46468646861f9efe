"""The web views beside the report: `make ui` (MLflow) and optuna-dashboard, really served."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from tests.report_study import build_study
from tests.servers import free_port, start_logged, stop_group, wait_until_served

ROOT = Path(__file__).resolve().parent.parent


def test_optuna_dashboard_serves_the_study(tmp_path: Path) -> None:
    # The one skip in the report's tests: optuna-dashboard is the optional [dashboard] extra.
    pytest.importorskip("optuna_dashboard", reason="the [dashboard] extra is not installed")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    build_study(storage, "dashboard", layout=["complete", "pruned", "never_trained"])
    port = free_port()
    command = Path(sys.executable).with_name("optuna-dashboard")
    log = tmp_path / "dashboard.log"
    proc = start_logged(
        [str(command), storage, "--host", "127.0.0.1", "--port", str(port)], log, ROOT
    )
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_until_served(f"{base}/dashboard", proc, log) == 200
        with urllib.request.urlopen(f"{base}/api/studies", timeout=30) as response:
            assert b'"dashboard"' in response.read()
    finally:
        stop_group(proc)


def test_make_ui_serves_mlflow_and_prints_the_runs_view(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = MlflowClient(tracking_uri=store).create_experiment("hpo-lora")
    port = free_port()
    # -o: never rebuild the virtual environment from inside a test.
    log = tmp_path / "make-ui.log"
    command = ["make", "-s", "-o", ".venv/.installed-stamp", "ui", f"PY={sys.executable}",
               f"UI_PORT={port}", f"UI_STORE={store}"]  # fmt: skip
    proc = start_logged(command, log, ROOT)
    try:
        assert wait_until_served(f"http://127.0.0.1:{port}/health", proc, log) == 200
        first = log.read_text().splitlines()[0]
        url = (
            f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs?workflowType=machine_learning"
        )
        assert url in first, first
    finally:
        stop_group(proc)  # the group this test started (make + its server)
