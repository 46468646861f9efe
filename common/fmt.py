"""Durations as people read them, in messages, progress bars, summaries and chart axes."""

from __future__ import annotations


def format_duration(seconds: float) -> str:
    """Hours when long, minutes or seconds when short: `14.2 h`, `12.5 min`, `42 s`, `250 ms`.

    Below one second the value is in milliseconds (three significant digits), so that the
    ticks of a chart of short trials read `100 ms`, `200 ms`, `500 ms` and not `0 s` each.
    A value that would round up to the next unit's first value is written in that unit
    (`1.0 min`, not `60 s`).
    """
    seconds = max(0.0, float(seconds))
    if seconds >= 3600 - 3:  # 59.95 min and more would print as `60.0 min`
        return f"{seconds / 3600:.1f} h"
    if seconds >= 59.5:
        return f"{seconds / 60:.1f} min"
    milliseconds = seconds * 1000
    if 0 < milliseconds < 999.5:
        return f"{milliseconds:.3g} ms"
    return f"{seconds:.0f} s"


def format_hours(hours: float, *, minute_decimals: int = 1) -> str:
    """A duration given in hours, for a summary line: `42 s`, `12.5 min`, `14.2 h`.

    Minutes up to an hour and a half (`85.0 min` reads better than `1.4 h`); seconds below
    one minute, with a decimal below ten (`0.6 s`: a tiny model's trial, which read `0 s`)
    and milliseconds below a tenth of a second. `minute_decimals`: digits after the point
    for minutes.
    """
    minutes = hours * 60
    seconds = max(0.0, minutes * 60)
    if 0 < seconds < 0.0995:
        return f"{seconds * 1000:.2g} ms"
    if seconds < 9.95:
        return f"{seconds:.1f} s" if seconds > 0 else "0 s"
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if minutes < 90:
        return f"{minutes:.{minute_decimals}f} min"
    return f"{hours:.1f} h"
