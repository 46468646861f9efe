"""Separate a time model's own error from the machine's drift.

A round is a set of runs, one per configuration, made close together in time; measured /
predicted of every run in it carries the machine's speed at that time (its level) as well
as the model's error for that configuration. Dividing each round by its median takes the
level out; what is left per configuration (the shape error) is what the model itself gets
wrong. `time_model_shape.py` and `time_model_accuracy.py` both report it this way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks._common import median


def divide_by_level(
    rounds: list[dict[str, float]],
) -> tuple[dict[str, list[float]], list[float]]:
    """Divide every round's measured / predicted ratios by the round's median.

    Args:
        rounds: Per round, measured / predicted of each configuration.

    Returns:
        Per configuration its level-corrected ratios over the rounds, and each round's level.
    """
    corrected: dict[str, list[float]] = {}
    levels: list[float] = []
    for this_round in rounds:
        level = median(list(this_round.values()))
        levels.append(level)
        for name, ratio in this_round.items():
            corrected.setdefault(name, []).append(ratio / level)
    return corrected, levels


def shape_errors(corrected: dict[str, list[float]]) -> dict[str, Any]:
    """Shape ratio and |error| % per configuration, and their median and p90.

    The shape ratio of a configuration is the median over rounds of its level-corrected
    ratio; its spread over rounds says how well one round pins it down.
    """
    rows = {}
    for name, ratios in corrected.items():
        shape = median(ratios)
        rows[name] = {
            "shape_ratio": shape,
            "shape_abs_pct_error": 100 * abs(shape - 1.0),
            "ratio_spread_pct": 100 * float(np.std(ratios) / np.mean(ratios)),
        }
    errors = [r["shape_abs_pct_error"] for r in rows.values()]
    return {
        "rows": rows,
        "median_abs_pct_error": median(errors),
        "p90_abs_pct_error": float(np.percentile(errors, 90)),
    }


def level_spread_pct(levels: list[float]) -> float:
    """How far the machine's level moved between rounds, in % of the median level."""
    return 100 * (max(levels) - min(levels)) / median(levels)
