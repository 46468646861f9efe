"""analysis.search.quality: a plan's size read off the replayed pick-by-budget curve."""

from __future__ import annotations

import pytest

from analysis.search.quality import expected_pick

TABLE = {
    "curves": "test curves",
    "study_size": 12,
    "budgets": [
        {"full_runs": 1.5, "pick_in_best_two": 0.9},
        {"full_runs": 0.5, "pick_in_best_two": 0.7},
        {"full_runs": 1.0, "pick_in_best_two": 0.8},
    ],
}


def test_a_plan_reads_its_size_off_the_replayed_curve() -> None:
    between = expected_pick(0.75, True, TABLE)
    assert between is not None and between["pick_in_best_two"] == pytest.approx(0.75)
    assert between["unscaled"] == {"full_runs": 1.5, "pick_in_best_two": 0.9}
    assert expected_pick(2.0, True, TABLE)["pick_in_best_two"] == 0.9  # type: ignore[index]
    # Smaller than any budget replayed, a schedule without rungs, or no table: unknown.
    assert expected_pick(0.3, True, TABLE) is None
    assert expected_pick(1.0, False, TABLE) is None
    assert expected_pick(1.0, True, {}) is None
