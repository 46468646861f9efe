"""Nothing follows a command's summary: the libraries' notices are silenced at their source.

A tracked full run saves its adapter as an MLflow model after the summary is printed, which
is where `mlflow.transformers` and PEFT used to add four lines (`common.library_logs`); the
model lands beside the SQLite store, not in the folder the command was typed in.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cli import module_command
from trainers.adapter_model import MODEL_FOLDER


def test_a_tracked_full_run_ends_with_its_summary(small_data: Path, tiny_model_dir: Path,
                                                  tmp_path: Path) -> None:  # fmt: skip
    out, store, typed_in = tmp_path / "out", tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir()
    typed_in.mkdir()
    argv: list[str | Path] = ["--model", tiny_model_dir, "--data", small_data, "--max-steps", "3",
            "--eval-interval", "3", "--micro-batch-size", "2", "--output-dir", out,
            "--tracking-uri", f"sqlite:///{store / 'mlflow.db'}"]  # fmt: skip
    # One stream, unbuffered: the lines in the order the user sees them on a terminal.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        module_command("trainers.train", *argv), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=typed_in, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (out / MODEL_FOLDER / "MLmodel").is_file()  # the adapter model was saved: the
    # step whose notices this test is about ran
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines[-1].startswith("best validation loss"), lines[-6:]
    # A new experiment keeps its artifacts beside its SQLite store, not where the command
    # was typed (MLflow's ./mlruns).
    assert not list(typed_in.iterdir())
    assert any(p.name == "MLmodel" for p in (store / "mlartifacts").rglob("*"))
