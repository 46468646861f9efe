"""`benchmarks/band_coverage.py`: the band's coverage pooled over recorded studies."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from benchmarks.band_coverage import calibration_bounds, pooled


def _prediction(full: float, p10: float, p50: float, p90: float) -> dict[str, Any]:
    return {"full_run_loss": full, "p10": p10, "p50": p50, "p90": p90}


def test_coverage_is_pooled_over_sets_and_each_set_is_counted_on_its_own() -> None:
    inside, outside = _prediction(1.0, 0.5, 1.0, 2.0), _prediction(3.0, 0.5, 1.5, 2.0)
    scores = pooled(
        {
            "fresh-chat-seed1": [inside, inside, inside, outside],  # 3 of 4
            "pre-pc": [inside, outside, outside, outside],  # 1 of 4
        }
    )
    assert scores["predictions"] == 8 and scores["sets"] == 2
    assert scores["band_coverage"] == pytest.approx(4 / 8)
    assert scores["band_coverage_held_out"] == pytest.approx(3 / 4)  # the seed-1 set alone
    assert scores["lowest_set_coverage"] == pytest.approx(1 / 4)
    assert scores["sets_below_target"] == 2
    # |p50 / full - 1|: 0 for the inside ones, 50 % for the outside ones.
    assert scores["median_abs_pct_error"] == pytest.approx(25.0)
    # (p90 - p10) / 2 / p50: 75 % inside, 50 % outside.
    assert scores["median_band_halfwidth_pct"] == pytest.approx(62.5)


def _group(p50: list[float], full: list[float], last: list[float]) -> list[dict[str, Any]]:
    return [
        {"p50": p, "full_run_loss": f, "loss_at_fidelity": x}
        for p, f, x in zip(p50, full, last, strict=True)
    ]


def test_a_calibration_the_full_runs_follow_exactly_leaves_no_error() -> None:
    rng = np.random.default_rng(0)
    groups = []
    for _ in range(3):
        p50 = np.exp(rng.uniform(0.0, 2.0, 8))
        last = p50 * np.exp(rng.uniform(0.1, 1.0, 8))  # unrelated to how the runs end
        full = np.exp(0.2 + 0.5 * np.log(p50))  # the law's spread is twice the truth's
        groups.append(_group(list(p50), list(full), list(last)))
    bounds = calibration_bounds(groups)
    for name in (
        "the other full runs, regressed on log p50 and log last loss",
        "every full run, its own too, regressed on log p50",
    ):
        assert bounds[name]["median_abs_pct_error"] == pytest.approx(0.0, abs=1e-6)
        assert bounds[name]["halfwidth_for_80_pct"] == pytest.approx(0.0, abs=1e-6)
        assert bounds[name]["rows_within_5_pct"] == bounds[name]["rows"] == 3
    # A shift alone cannot undo a slope of 0.5, and the raw p50 is further off still.
    shifted = bounds["the other full runs' median ratio"]["median_abs_pct_error"]
    assert 1.0 < shifted < bounds["none (the p50)"]["median_abs_pct_error"]


def test_the_half_width_for_80_percent_is_the_80th_percentile_of_the_log_error() -> None:
    # Ten configurations: eight 0.1 off in ln, two 0.5 off; the 80th percentile is 0.1 ...
    p50 = [2.0] * 10
    full = [2.0 * math.exp(s) for s in (0.1, -0.1, 0.1, -0.1, 0.1, -0.1, 0.1, -0.1, 0.5, -0.5)]
    raw = calibration_bounds([_group(p50, full, p50)])["none (the p50)"]
    # ... so the band p * exp(+-0.1) holds 8 of 10, half of its width is sinh(0.1) of p.
    assert raw["halfwidth_for_80_pct"] == pytest.approx(100 * math.sinh(0.1))
    # |p / full - 1| is 9.5 % below and 10.5 % above; the middle two are 10.5 % (above).
    assert raw["median_abs_pct_error"] == pytest.approx(100 * math.expm1(0.1))
    assert raw["rows_within_10_pct"] == raw["rows_within_5_pct"] == 0


def test_a_common_bias_is_all_a_median_ratio_needs_to_learn() -> None:
    p50 = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]
    full = [0.7 * p for p in p50]  # every prediction 1 / 0.7 too high
    bounds = calibration_bounds([_group(p50, full, p50)])
    assert bounds["none (the p50)"]["median_abs_pct_error"] == pytest.approx(100 * 0.3 / 0.7)
    for name in (
        "the other full runs' median ratio",
        "every full run, its own too: their median ratio",
    ):
        assert bounds[name]["median_abs_pct_error"] == pytest.approx(0.0, abs=1e-9)
