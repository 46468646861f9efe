"""The benchmarks' split of a time model's error into the machine's level and its own shape."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks._levels import divide_by_level, level_spread_pct, shape_errors
from benchmarks.time_model_accuracy import HELD_OUT, print_report, summarize


def test_a_round_divided_by_its_level_leaves_the_shape() -> None:
    # Round two ran on a machine 30 % slower; the model is 10 % off on "b" in both.
    rounds = [{"a": 1.0, "b": 1.1, "c": 0.9}, {"a": 1.3, "b": 1.43, "c": 1.17}]
    corrected, levels = divide_by_level(rounds)
    assert levels == pytest.approx([1.0, 1.3])
    assert corrected["b"] == pytest.approx([1.1, 1.1])
    shape = shape_errors(corrected)
    assert shape["rows"]["b"]["shape_abs_pct_error"] == pytest.approx(10.0)
    assert shape["rows"]["a"]["ratio_spread_pct"] == pytest.approx(0.0)
    assert shape["median_abs_pct_error"] == pytest.approx(10.0)
    assert level_spread_pct(levels) == pytest.approx(100 * 0.3 / 1.15)


def fake_row(index: int, level: float) -> dict[str, Any]:
    predicted = 100.0 + index
    return {
        "config": HELD_OUT[index].name,
        "optimizer_steps": 10,
        "evaluations": 3,
        "checkpoints": 2,
        "predicted_p10_s": 0.8 * predicted,
        "predicted_p50_s": predicted,
        "predicted_p90_s": 1.2 * predicted,
        "measured_s": predicted * level * (1.05 if index == 0 else 1.0),
        "inside_band": True,
        "x_longest_probe": 12.0,
        "predicted_memory_mb": 500.0,
        "predicted_memory_p90_mb": 525.0,
        "measured_memory_mb": 510.0 + index,
        "memory_abs_pct_error": 2.0,
        "memory_pct_above_p50": 2.0 + index / 5,
        "memory_above_p90": False,
    }


def test_accuracy_summary_reports_raw_and_shape_error_and_the_noise_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    probes: dict[str, Any] = {
        "runs": 10,
        "seconds": 60.0,
        "median_seconds": 5.0,
        "longest_seconds": 10.0,
    }

    class Calibration:
        calibration_id = "x"
        n_measurements: dict[str, int] = {}

        class coefficients:  # noqa: N801
            @staticmethod
            def to_dict() -> dict[str, float]:
                return {}

    probes["calibration"] = Calibration
    repeats = [(probes, [fake_row(i, level) for i in range(len(HELD_OUT))]) for level in (1.0, 1.3)]
    summary = summarize(repeats, None)
    # Raw: the 30 % slower repeat shows as error; the shape error keeps only the 5 % of row 0.
    assert summary["median_abs_pct_error"] > 10
    assert summary["shape_median_abs_pct_error"] == pytest.approx(0.0, abs=1e-9)
    assert summary["rows"][0]["shape_abs_pct_error"] == pytest.approx(5.0)
    assert summary["noise_floor_pct"] == pytest.approx(30.0)
    assert summary["levels"] == pytest.approx([1.0, 1.3])
    assert summary["rows"][0]["predicted_memory_p90_mb"] == 525.0
    assert summary["memory_above_p90_fraction"] == 0.0
    for key in ("shape_p90_abs_pct_error", "p90_abs_pct_error", "band_coverage"):
        assert key in summary
    print_report(summary)
    assert "noise floor 30.0 %" in capsys.readouterr().out
    single = summarize(repeats[:1], {**fake_row(0, 1.1), "config": "again"})
    assert single["noise_floor_pct"] == pytest.approx(10.0)
    print_report(single)
    assert "shape err %" in capsys.readouterr().out
