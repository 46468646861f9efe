"""Bad input through the real `python -m` entry points: exit 2, one line, nothing written.

The full matrix of bad input runs in-process in tests/test_bad_input.py; these check that
the command lines themselves map it to exit code 2 the same way.
"""

from __future__ import annotations

from pathlib import Path

from tests.cli import run_module


def test_study_command_exits_2_with_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    work = tmp_path / "work"
    proc = run_module(
        "hpo.study", "--no-progress", "--model", str(tiny_model_dir),
        "--work-dir", str(work), "--json", str(tmp_path / "s.json"),
        "--storage", "postgresql://u:topsecret@127.0.0.1:1/db",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot open storage postgresql://u:***@" in lines[0], proc.stderr
    assert "topsecret" not in proc.stderr + proc.stdout
    assert not (tmp_path / "s.json").exists()
    assert not (work / "optuna.db").exists() and not (work / "mlflow.db").exists()


def test_export_unknown_study(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    proc = run_module(
        "hpo.export", "--study-name", "nope", "--storage", f"sqlite:///{tmp_path / 'x.db'}",
        "--out", str(out), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "nope" in proc.stderr
    assert not out.exists()
