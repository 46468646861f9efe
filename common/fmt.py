"""Durations as people read them, in messages, progress bars and summaries."""

from __future__ import annotations


def format_duration(seconds: float) -> str:
    """Hours when long, minutes or seconds when short: `14.2 h`, `12.5 min`, `42 s`."""
    seconds = max(0.0, float(seconds))
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
