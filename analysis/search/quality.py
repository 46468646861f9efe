"""What a search of a given size bought on recorded real fine-tuning curves.

`benchmarks/curve_replay.py --write-quality` replays the study's default schedule (trials,
then its rungs) scaled into budgets of search and writes, per budget, its training in full
runs and how often its pick was among the best two of the study's configurations
(`search_quality.json` beside this module). A plan reads its own size off that curve: what
it should expect, and what the unscaled schedule would add. The curves are of one model and
one data set (their source is in the file): a user's own may rank harder or easier.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

QUALITY_FILE = Path(__file__).resolve().parent / "search_quality.json"


@cache
def _table() -> dict[str, Any]:
    try:
        return dict(json.loads(QUALITY_FILE.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def expected_pick(
    full_runs: float, rungs: bool, table: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The replayed share of studies whose pick was among their best two, at `full_runs` of
    training (interpolated between the replayed budgets), for a schedule with rungs; None
    without rungs, without the file, or below the smallest budget replayed. `table`: the
    file's content (default: read once)."""
    table = _table() if table is None else table
    points = sorted((float(p["full_runs"]), float(p["pick_in_best_two"])) for p in table.get("budgets", []))
    if not rungs or not points or full_runs < points[0][0]:
        return None
    share = points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= full_runs <= x1:
            share = y0 + (y1 - y0) * (full_runs - x0) / (x1 - x0) if x1 > x0 else y1
            break
    return {
        "pick_in_best_two": share,
        "study_size": table.get("study_size"),
        "curves": table.get("curves"),
        "unscaled": {"full_runs": points[-1][0], "pick_in_best_two": points[-1][1]},
    }


def pick_lines(full_runs: float, rungs: bool) -> list[str]:
    """The plan's line on what its size bought on the recorded curves (none where unknown)."""
    expected = expected_pick(full_runs, rungs)
    if expected is None:
        return []
    unscaled = expected["unscaled"]
    more = ""
    if unscaled["full_runs"] > full_runs * 1.05:
        more = (
            f"; the unscaled schedule ({unscaled['full_runs']:.2g} full runs) "
            f"{100 * unscaled['pick_in_best_two']:.0f} %"
        )
    return [
        f"  on recorded real LoRA curves ({expected['curves']}) this schedule "
        f"({full_runs:.2g} full runs of training) picked one of the best 2 of "
        f"{expected['study_size']} configurations in {100 * expected['pick_in_best_two']:.0f} % "
        f"of studies{more}"
    ]
