"""`probe_seconds`: without a calibration for its hardware + model, a study probes the machine
once before its first trial (real training of the probe design); the next study reuses it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient

from analysis.calibrate import PROBE_DESIGN
from analysis.calibration.file import load
from common.errors import BadInputError
from common.workdir import CALIBRATION_FILE
from hpo.config import StudyConfig
from hpo.estimator import StudyEstimator
from hpo.prepare import prepare
from hpo.runner import run_study
from tests.configs import short_study

FAST_PRIOR = lambda: 1e10  # noqa: E731  (the CPU probe of the priors: no timing in tests)


def config_for(work: Path, model: Path, data: Path, **overrides: Any) -> StudyConfig:
    values: dict[str, Any] = {
        "data": str(data),
        "study_name": "probed",
        "trial_fraction": 0.05,
        "sampler": "random",
        # A budget of 1 s: the three probe runs that always run, then it stops.
        "probe_seconds": 1.0,
        "seed": 1,
    }
    return short_study(work, model, {**values, **overrides})


def probe_shapes(count: int) -> set[tuple[int, int, int]]:
    return {(p.micro_batch_size, p.max_length, p.lora_r) for p in PROBE_DESIGN[:count]}


class Recorded(logging.Handler):
    """The messages of one logger, for a module-scoped fixture (caplog is per test)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def probed(
    tiny_model_dir: Path, small_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[StudyConfig, StudyEstimator, list[str]]:
    """A work dir without a calibration, and the estimator that probed it (the one probe)."""
    config = config_for(tmp_path_factory.mktemp("probed"), tiny_model_dir, small_data)
    handler, logger = Recorded(), logging.getLogger("hpo.estimator")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        estimator = StudyEstimator(config, prepare(config), cpu_probe=FAST_PRIOR)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return config, estimator, handler.messages


def test_without_a_calibration_the_estimator_probes_and_saves_it(probed: Any) -> None:
    config, first, messages = probed
    work = Path(config.work_dir)
    assert first.probe_runs == 3
    saved = load(work / CALIBRATION_FILE)
    assert first.calibration is not None
    assert saved.calibration_id == first.calibration.calibration_id
    assert saved.fingerprint == first.fingerprint
    # Fitted from the design's first three configurations, each a real run with its
    # evaluation and checkpoint save.
    assert saved.n_measurements["runs"] == 3
    assert saved.n_measurements["eval"] == 3 and saved.n_measurements["checkpoint"] == 3
    assert {(r.micro_batch_size, r.max_length, r.lora_r) for r in saved.runs} == probe_shapes(3)
    assert first.coefficients.source == f"calibration:{saved.calibration_id}"
    assert first.coefficients.micro_seconds_per_flop != first.prior.micro_seconds_per_flop
    assert any("probing this machine" in m for m in messages)
    assert any("calibrated from 3 probe runs" in m for m in messages)
    # No probe leftovers in the work dir: the runs trained in a temporary folder.
    assert not list(work.glob("probe-*"))


def test_switched_off_a_work_dir_without_calibration_stays_on_the_priors(
    probed: Any, tiny_model_dir: Path, small_data: Path, tmp_path: Path
) -> None:
    _, first, _ = probed
    off = StudyEstimator(
        config_for(tmp_path, tiny_model_dir, small_data, probe_seconds=0),
        first.prepared,
        cpu_probe=FAST_PRIOR,
    )
    assert off.probe_runs == 0 and off.calibration is None
    assert off.coefficients.source.startswith("prior:")
    assert not (tmp_path / CALIBRATION_FILE).exists()


def test_the_next_study_reuses_the_probe_calibration_without_probing(
    probed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    config, first, _ = probed
    with caplog.at_level(logging.INFO, logger="hpo.estimator"):
        summary = run_study(config, progress=False)
    assert not [r for r in caplog.records if "probing" in r.getMessage()]
    assert summary.states["complete"] == 1
    calibration = load(Path(config.work_dir) / CALIBRATION_FILE)
    assert calibration.n_measurements["runs"] == 4  # the three probe runs, then the trial
    # Its first trial was checked with the probe's calibration, not the priors.
    trial = optuna.load_study(study_name="probed", storage=config.storage_url).trials[0]
    assert (
        trial.user_attrs["time_model_source"] == f"calibration:{first.calibration.calibration_id}"
    )
    # The switch is on the study's MLflow parent run, and the preset's estimate says which
    # part of its band is widest.
    parent = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_parent_run_id)
    assert float(parent.data.params["probe_seconds"]) == 1.0
    band = summary.best_estimate["band_pct"]
    assert set(band) == {"model", "drift", "step_noise", "total"}
    assert band["total"] >= max(band["model"], band["drift"], band["step_noise"]) > 0


def test_probe_seconds_must_not_be_negative(tiny_model_dir: Path, small_data: Path) -> None:
    with pytest.raises(BadInputError, match="probe_seconds must be >= 0"):
        config_for(Path("unused"), tiny_model_dir, small_data, probe_seconds=-1)
