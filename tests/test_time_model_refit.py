"""Measured runs stored with `--raw` are refitted offline: the same rows under both fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.time_model_refit import FITS, main

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "docs" / "measurements" / "gpu-time-model-h100.json"


def test_refits_the_h100_measurement_under_both_fits(tmp_path: Path) -> None:
    out = tmp_path / "refit.json"
    assert main(["--smoke", "--json", str(out)]) == 0  # the smoke refits this measurement
    result = json.loads(out.read_text())
    raw = json.loads(H100.read_text())
    assert result["raw"] == str(H100)
    assert [r["fit"] for r in result["rows"]] == [f for f in FITS for _ in raw["held_out"]]
    apart, together = (result["summary"][name] for name in FITS)
    # The H100's new padded lengths cost a one-off fitted apart; fitted together they
    # inflate the mean step instead, and every held-out run is predicted longer.
    assert apart["new_shape_seconds"] > 0.05 and together["new_shape_seconds"] == 0.0
    assert together["step_mean_ratio"] > apart["step_mean_ratio"]
    n = len(raw["held_out"])
    for a, t in zip(result["rows"][:n], result["rows"][n:], strict=True):
        assert a["config"] == t["config"] and a["measured_s"] == t["measured_s"]
        assert a["predicted_p50_s"] < t["predicted_p50_s"]


def test_a_file_that_is_not_raw_runs_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from common.cli import run_cli

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    assert run_cli(main, [str(bad)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "not a --raw file" in err[0], err
