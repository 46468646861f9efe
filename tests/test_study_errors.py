"""Bad input to the study and export commands: exit 2, one line, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _study(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpo.study", "--no-progress", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "config_text", "expected"),
    [
        (["--sampler", "bogus"], None, "sampler"),
        (["--pruner", "bogus"], None, "pruner"),
        (["--n-trials", "0"], None, "n_trials"),
        (["--window-hours", "-1"], None, "window_hours"),
        (["--profiles", "turbo"], None, "turbo"),
        (["--data", "nope.jsonl"], None, "nope.jsonl"),
        ([], "trial_fraction: 0.1\nbogus_field: 1\n", "bogus_field"),
        ([], "budget:\n  window_hours: 0\n", "window_hours"),
        ([], "sampler: [unclosed\n", "not valid YAML"),
        ([], "space: missing-space.yaml\n", "missing-space.yaml"),
        (["--storage", "postgresql://u:topsecret@127.0.0.1:1/db"], None, "cannot open storage"),
    ],
)
def test_bad_input_exit_2(
    tmp_path: Path, tiny_model_dir: Path, args: list[str], config_text: str | None, expected: str
) -> None:
    work = tmp_path / "work"
    extra = [
        "--model",
        str(tiny_model_dir),
        "--work-dir",
        str(work),
        "--json",
        str(tmp_path / "s.json"),
    ]
    if config_text is not None:
        (tmp_path / "study.yaml").write_text(config_text)
        extra += ["--config", str(tmp_path / "study.yaml")]
    proc = _study(*extra, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "topsecret" not in proc.stderr + proc.stdout
    assert not (tmp_path / "s.json").exists()
    assert not (work / "optuna.db").exists() and not (work / "mlflow.db").exists()


def test_invalid_space_file(tmp_path: Path, tiny_model_dir: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "learning_rate: {loguniform: [1.0e-2, 1.0e-5]}\n"
        "lora_r: {choice: [4, 8]}\nlora_alpha_ratio: {choice: [2]}\nlora_dropout: 0.0\n"
    )
    proc = _study(
        "--model",
        str(tiny_model_dir),
        "--work-dir",
        str(tmp_path / "w"),
        "--space",
        str(space),
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "learning_rate" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "w" / "optuna.db").exists()


def test_export_unknown_study(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "hpo.export", "--study-name", "nope", "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "nope" in proc.stderr
    assert not out.exists()
