"""`python -m analysis.calibrate`: refit from a study's trials, a short probe, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from analysis.calibrate import ProbeConfig, calibrate_from_results, main, run_probes
from analysis.calibration.file import load
from analysis.study_keys import TIME_MODEL_RUN_ATTR
from analysis.timemodel.machine import this_machine
from common.cli import run_cli
from common.workdir import CALIBRATION_FILE
from hpo.config import load_config
from hpo.runner import run_study
from tests.cli import run_module
from trainers.data.paths import demo_data_path


@pytest.fixture(scope="module")
def recorded_study(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("calibrate")
    config = load_config(
        None,
        {
            "model": str(tiny_model_dir),
            "work_dir": str(work),
            "study_name": "recorded",
            "n_trials": 2,
            "trial_fraction": 0.015,
            "trial_evals": 2,
            "eval_samples": 8,
            "profiles": ["fast"],
            "sampler": "random",
            "pruner": "none",
            "rungs": "none",
        },
    )
    run_study(config, progress=False)
    return config, work


def test_fits_from_the_trials_a_study_recorded(recorded_study: Any, tmp_path: Path) -> None:
    config, work = recorded_study
    out = tmp_path / "cal.json"
    proc = run_module("analysis.calibrate", "--study-name", "recorded",
                      "--storage", config.storage_url, "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(out) in proc.stdout
    calibration = load(out)
    study = optuna.load_study(study_name="recorded", storage=config.storage_url)
    trained = [t for t in study.trials if TIME_MODEL_RUN_ATTR in t.user_attrs]
    assert calibration.n_measurements["runs"] == len(trained) == 2
    # The same fingerprint the study's own calibration file has: a study will load it.
    assert calibration.fingerprint == load(work / CALIBRATION_FILE).fingerprint
    assert calibration.fingerprint == trained[0].user_attrs["estimate"]["hardware_fingerprint"]


def test_default_out_is_the_study_work_dir(recorded_study: Any, tmp_path: Path) -> None:
    config, work = recorded_study
    before = load(work / CALIBRATION_FILE)
    proc = run_module("analysis.calibrate", "--study-name", "recorded",
                      "--storage", config.storage_url, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(work / CALIBRATION_FILE) in proc.stdout
    after = load(work / CALIBRATION_FILE)
    assert after.fingerprint == before.fingerprint
    assert after.n_measurements["runs"] == 2


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--study-name", "nope"], "no study named 'nope'"),
        ([], "give --study-name (with --storage), --probe"),
        (["--full-run", "/nonexistent/result.json"], "cannot read full-run report"),
        (["--probe", "--study-name", "recorded"], "either --study-name"),
    ],
)
def test_bad_input_exits_2(
    recorded_study: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
) -> None:
    config, _ = recorded_study
    storage = ["--storage", config.storage_url] if "--study-name" in args else []
    code = run_cli(main, [*args, *storage, "--out", str(tmp_path / "c.json")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "c.json").exists()


def test_missing_database_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "missing.db"
    assert run_cli(main, ["--study-name", "x", "--storage", f"sqlite:///{db}"]) == 2
    assert "no study named 'x'" in capsys.readouterr().err
    assert not db.exists()


def test_study_without_measurements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    optuna.create_study(study_name="empty", storage=storage)
    assert run_cli(main, ["--study-name", "empty", "--storage", storage]) == 2
    assert "no trained trial with time-model measurements" in capsys.readouterr().err


def test_probe_runs_fit_one_calibration(tiny_model_dir: Path, tmp_path: Path) -> None:
    design = (ProbeConfig(2, 1, 64, 4), ProbeConfig(8, 2, 128, 16), ProbeConfig(4, 1, 96, 8))
    results = run_probes(
        str(tiny_model_dir), str(demo_data_path()), design, work_dir=tmp_path, eval_samples=8
    )
    assert len(results) == 3
    for result, point in zip(results, design, strict=True):
        assert result["optimizer_steps"] == point.max_steps
        assert len(result["eval_records"]) == 1 and len(result["checkpoint_seconds"]) == 1
        assert result["eval_samples"] == 8
    calibration = calibrate_from_results(results, this_machine())
    assert calibration.n_measurements["runs"] == 3
    assert calibration.n_measurements["checkpoint"] == 3
    assert calibration.coefficients.source == f"calibration:{calibration.calibration_id}"
