"""Durations as people read them: every unit, its edges, and values below one second."""

from __future__ import annotations

import pytest

from common.fmt import format_duration, format_hours


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (-3.0, "0 s"),  # a clock that stepped back is not a negative duration
        (0.0005, "0.5 ms"),
        (0.0123, "12.3 ms"),
        (0.25, "250 ms"),
        (0.9994, "999 ms"),
        (0.9996, "1 s"),  # not `1e+03 ms`
        (1.0, "1 s"),
        (42.0, "42 s"),
        (59.4, "59 s"),
        (59.6, "1.0 min"),  # not `60 s`
        (750.0, "12.5 min"),
        (3590.0, "59.8 min"),
        (3598.0, "1.0 h"),  # not `60.0 min`
        (51_120.0, "14.2 h"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_ticks_below_one_second_are_told_apart() -> None:
    ticks = [m * 10.0**e for e in range(-4, 0) for m in (1, 2, 5)]  # 0.1 ms .. 500 ms
    labels = [format_duration(t) for t in ticks]
    assert len(set(labels)) == len(labels), labels
    assert all(label.endswith(" ms") for label in labels), labels


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (0.0004, "0.4 ms"),
        (0.05, "50 ms"),
        (0.6, "0.6 s"),  # a tiny model's trial in a search plan: it read `0 s`
        (4.24, "4.2 s"),
        (9.96, "10 s"),
        (42.0, "42 s"),
        (59.6, "1.0 min"),  # not `60 s`
        (750.0, "12.5 min"),
        (5000.0, "83.3 min"),  # minutes up to an hour and a half
        (7200.0, "2.0 h"),
    ],
)
def test_format_hours(seconds: float, text: str) -> None:
    assert format_hours(seconds / 3600) == text
