"""A new SQLite MLflow store starts as a copy of the empty one MLflow created here before
(`common.mlflow_seed`): it works like one MLflow made, and nothing else is ever copied."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import mlflow_seed
from common.mlflow_writer import MlflowWriter


def _use(uri: str) -> tuple[float, str]:
    writer = MlflowWriter(uri)
    try:
        client = writer.client
        run = client.create_run(client.create_experiment("seeded"))
        client.log_metric(run.info.run_id, "loss", 1.5)
        default = client.get_experiment("0")
        return client.get_run(run.info.run_id).data.metrics["loss"], default.artifact_location
    finally:
        writer.close()


def test_a_new_store_is_seeded_from_the_first_empty_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    template = mlflow_seed.template_path()
    assert not template.exists()
    assert _use(f"sqlite:///{tmp_path / 'first.db'}")[0] == 1.5  # MLflow migrates this one
    assert template.is_file()  # kept empty: the run came after
    second = tmp_path / "second.db"
    assert mlflow_seed.seed(second)
    loss, location = _use(f"sqlite:///{second}")
    assert loss == 1.5
    assert location == str(tmp_path / "mlruns" / "0")  # as MLflow sets it where it starts
    assert not mlflow_seed.seed(second)  # an existing store is never replaced
    assert not list(tmp_path.glob(".*.seed"))  # no staging copy left behind


def test_a_store_with_runs_is_not_kept_and_options_are_left_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPO_CACHE_DIR", str(tmp_path / "cache"))
    store = tmp_path / "used.db"
    _use(f"sqlite:///{store}")
    mlflow_seed.template_path().unlink()
    mlflow_seed.keep(store)  # it holds a run and an experiment of its own
    assert not mlflow_seed.template_path().exists()
    assert mlflow_seed.sqlite_path(f"sqlite:///{store}?timeout=5") is None
    assert mlflow_seed.sqlite_path("http://127.0.0.1:5000") is None
