"""`benchmarks/band_coverage.py`: the band's coverage pooled over recorded studies."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.band_coverage import pooled


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
