"""Loss against time (or money): the configurations no other one beats on both.

A point is ``(loss, hours_or_cost, id)``; both coordinates are minimised.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import TypeVar

Id = TypeVar("Id", bound=Hashable)


def _finite(points: Iterable[tuple[float, float, Id]]) -> list[tuple[float, float, Id]]:
    return [p for p in points if math.isfinite(p[0]) and math.isfinite(p[1])]


def pareto_front(points: Iterable[tuple[float, float, Id]]) -> list[tuple[float, float, Id]]:
    """The non-dominated points: none other has both a lower-or-equal loss and cost.

    Of points with equal coordinates only the first is kept; non-finite points are ignored.

    Args:
        points: ``(loss, hours_or_cost, id)`` tuples.

    Returns:
        The front, cheapest first (so the loss falls along it).
    """
    ordered = sorted(_finite(points), key=lambda p: (p[1], p[0]))
    front: list[tuple[float, float, Id]] = []
    for point in ordered:
        if not front or point[0] < front[-1][0]:
            front.append(point)
    return front


def cheapest_within(
    points: Iterable[tuple[float, float, Id]], pct: float
) -> tuple[float, float, Id] | None:
    """The cheapest point whose loss is within `pct` percent of the best loss.

    "Within 1 %" of a best loss of 2.00 means a loss of at most 2.02. Ties in cost go to
    the lower loss.

    Args:
        points: ``(loss, hours_or_cost, id)`` tuples; non-finite ones are ignored.
        pct: The tolerance in percent, >= 0.

    Returns:
        The point, or None when there is no finite point.

    Raises:
        ValueError: `pct` is negative or not finite.
    """
    if not (math.isfinite(pct) and pct >= 0):
        raise ValueError(f"pct must be a finite number >= 0 but got {pct=}")
    usable = _finite(points)
    if not usable:
        return None
    best = min(p[0] for p in usable)
    limit = best + abs(best) * pct / 100.0
    return min((p for p in usable if p[0] <= limit), key=lambda p: (p[1], p[0]))
