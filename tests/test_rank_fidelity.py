"""`benchmarks/rank_fidelity.py` on a model and data the user names (`--model`,
`--data-file`): what a GPU measurement on real pre-trained weights runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import rank_fidelity
from tests.configs import demo_records


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1000 prompt/completion records: 200 held out for validation, one epoch of the rest."""
    return demo_records(tmp_path_factory.mktemp("rank-data") / "mine.jsonl", 1000)


def test_a_named_model_and_data_file_are_measured_and_recorded(
    tiny_model_dir: Path, data_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rank.json"
    argv = ["--model", str(tiny_model_dir), "--data-file", str(data_file), "--configs", "3",
            "--fractions", "0.1", "--reference-fractions", "0.3", "--promote", "0",
            "--threads", "1", "--json", str(out)]  # fmt: skip
    assert rank_fidelity.main(argv) == 0
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["model"] == str(tiny_model_dir)
    assert payload["data_file"] == str(data_file) and payload["data"] == "mine.jsonl"
    assert payload["device"] == "cpu"
    rows = payload["rows"]
    assert len(rows) == 3
    for row in rows:
        assert math.isfinite(row["full_run_loss"]) and row["full_run_loss"] > 0
        # One epoch of the file's training records, not of the 3000-record demo data.
        assert row["full_run_samples"] < 1000
        assert len(row["trials"]["0.1"]["eval_records"]) >= 2
    (reference,) = payload["references"]["0.1"]
    assert reference["fraction"] == 0.3
    end = payload["scores"]["0.1 ref 0.3 end"]["predictions"]
    assert [p["full_run_loss"] for p in end] == [r["full_run_loss"] for r in rows]
    assert f"{tiny_model_dir}, data {data_file}" in capsys.readouterr().out
    # Recorded runs are set up again from the same model and data (--rescore's training).
    with rank_fidelity.recorded_setup(payload) as (config, _prepared, _work):
        assert config.model == str(tiny_model_dir) and config.data == str(data_file)


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--pretrain-steps", "600"], "--pretrain-steps pre-trains the tiny llama"),
        (["--samples", "3000"], "--samples, --label-noise and --data make the demo data"),
        (["--data", "chat"], "--samples, --label-noise and --data make the demo data"),
    ],
)
def test_the_demo_options_are_refused_beside_a_named_model_or_data_file(
    tiny_model_dir: Path,
    data_file: Path,
    extra: list[str],
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--model", str(tiny_model_dir), "--data-file", str(data_file), *extra]
    with pytest.raises(SystemExit) as exit_info:
        rank_fidelity.main(argv)
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_a_missing_data_file_is_refused_before_anything_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        rank_fidelity.main(["--data-file", str(missing), "--json", str(tmp_path / "out.json")])
    assert exit_info.value.code == 2
    assert f"--data-file {missing} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
