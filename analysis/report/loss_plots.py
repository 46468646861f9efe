"""What the trials predict for their full runs: learning curves and the loss-cost front."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from analysis.curves.extrapolate import CurveFit
from analysis.report.canvas import CYCLE, Section, fmt, new_figure, save
from analysis.report.pareto import cheapest_within, pareto_front
from analysis.report.rows import TrialRow, finite

CURVES, PARETO = "curves.png", "pareto.png"
TOP_TRIALS = 5
WITHIN_PCT = 1.0  # "the cheapest within 1 % of the best predicted loss"


def recorded_curve(row: TrialRow) -> tuple[list[tuple[float, float]], CurveFit] | None:
    """A trial's (samples seen, val loss) points and its fit, when both are recorded whole."""
    raw, fit = row.attrs.get("val_curve"), row.attrs.get("curve_fit")
    if not isinstance(raw, list) or not isinstance(fit, Mapping):
        return None
    points = []
    for point in raw:
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            return None
        x, y = finite(point[0]), finite(point[1])
        if x is None or y is None or x <= 0:
            return None
        points.append((x, y))
    try:
        return (points, CurveFit.from_dict(fit)) if points else None
    except ValueError:
        return None


def curves(rows: Sequence[TrialRow], folder: Path, *, minimize: bool = True) -> Section:
    """Validation loss of the best trials against samples seen, extrapolated to the full run."""
    import numpy as np

    title = "Validation-loss curves of the top trials"
    sign = 1.0 if minimize else -1.0
    ranked = sorted(
        (row for row in rows if row.state == "complete" and row.value is not None),
        key=lambda row: (sign * float(row.value or 0.0), row.number),
    )
    top = [(row, c) for row in ranked if (c := recorded_curve(row))][:TOP_TRIALS]
    if not top:
        return Section(
            title,
            None,
            "Skipped: no complete trial records its validation curve "
            "(user attributes `val_curve` and `curve_fit`).",
        )
    fig, (ax,) = new_figure()
    for index, (row, (points, fit)) in enumerate(top):
        colour = CYCLE[index % len(CYCLE)]
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, "o-", color=colour, ms=4, label=f"trial {row.number}")
        p10, p50, p90 = _band(row, fit)
        last = xs[-1]
        if fit.target > last:
            ahead = np.geomspace(last, fit.target, 60)
            curve = fit.predict(ahead)
            ax.plot(ahead, curve, "--", color=colour, lw=1)
            # The band opens from the last measurement to the prediction's p10-p90 at the end.
            share = np.log(ahead / last) / math.log(fit.target / last)
            end = float(fit.predict(fit.target))
            ax.fill_between(
                ahead,
                curve + (p10 - end) * share,
                curve + (p90 - end) * share,
                color=colour,
                alpha=0.12,
                lw=0,
            )
        ax.errorbar(
            [fit.target],
            [p50],
            yerr=[[p50 - p10], [p90 - p50]],
            fmt="D",
            color=colour,
            ms=5,
            capsize=3,
        )
    for target in sorted({fit.target for _, (_, fit) in top}):
        ax.axvline(target, color="0.6", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("training samples seen (dotted: end of the full run)")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, folder / CURVES)

    best, (points, fit) = top[0]
    p10, p50, p90 = _band(best, fit)
    fallbacks = [f"trial {row.number}: {f.method}" for row, (_, f) in top if f.fell_back]
    fell = f"; fits that fell back: {', '.join(fallbacks)}" if fallbacks else ""
    return Section(
        title,
        CURVES,
        (
            f"Trial {best.number} predicted, when it ended, that its full run ends at {fmt(p50)} "
            f"(p10 {fmt(p10)}, p90 {fmt(p90)}) after {fit.target:,.0f} samples, from "
            f"{len(points)} evaluations up to {points[-1][0]:,.0f} samples{fell}. The summary "
            "and the exported preset predict it again with every curve the study holds at "
            "their time."
        ),
    )


def _band(row: TrialRow, fit: CurveFit) -> tuple[float, float, float]:
    """The corrected prediction when recorded, else the fit's own."""
    return row.predicted_loss or (fit.p10, fit.p50, fit.p90)


def pareto(rows: Sequence[TrialRow], folder: Path, *, exported: int | None) -> Section:
    """Predicted final loss against predicted full-run hours (and cost, when priced)."""
    title = "Pareto front: predicted final loss against full-run time and cost"
    complete = [row for row in rows if row.state == "complete"]
    by_hours = _points(complete, ("duration_hours", "p50"))
    if not by_hours:
        return Section(
            title,
            None,
            "Skipped: no complete trial records its predicted full-run "
            "duration (user attribute `estimate.duration_hours`).",
        )
    priced = any((row.estimate("price_per_hour") or 0.0) > 0 for row in complete)
    by_cost = _points(complete, ("cost",)) if priced else []
    panels = [(by_hours, "predicted full-run hours (p50)")]
    if by_cost:
        panels.append((by_cost, "predicted full-run cost"))
    fig, axes = new_figure(len(panels))
    for ax, (points, label) in zip(axes, panels, strict=True):
        front = pareto_front(points)
        ax.scatter(
            [p[1] for p in points],
            [p[0] for p in points],
            color="0.6",
            s=22,
            label="complete trial",
        )
        ax.step(
            [p[1] for p in front],
            [p[0] for p in front],
            where="post",
            color="tab:blue",
            marker="o",
            ms=5,
            label="Pareto front",
        )
        for loss, x, number in points:
            if number == exported:
                ax.scatter(
                    [x],
                    [loss],
                    marker="*",
                    s=220,
                    color="tab:red",
                    zorder=3,
                    label=f"exported (trial {number})",
                )
        ax.set_xlabel(label)
        ax.set_ylabel("predicted final validation loss (p50)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    save(fig, folder / PARETO)

    front = pareto_front(by_hours)
    cheap = cheapest_within(by_hours, WITHIN_PCT)
    costs = {number: x for _, x, number in by_cost}
    chosen = next((p for p in by_hours if p[2] == exported), None)
    if chosen is None:
        picked = f"the exported trial {exported} has no prediction on this plot"
    else:
        cost = f", cost {fmt(costs[chosen[2]])}" if chosen[2] in costs else ""
        picked = f"exported trial {chosen[2]}: loss {fmt(chosen[0])} in {fmt(chosen[1])} h{cost}"
    cheapest = (
        f"; the cheapest within {WITHIN_PCT:g} % of the best loss is trial {cheap[2]} "
        f"({fmt(cheap[1])} h)"
        if cheap
        else ""
    )
    return Section(
        title,
        PARETO,
        f"{len(front)} of {len(by_hours)} complete trials are on the front; {picked}{cheapest}.",
    )


def _points(rows: Sequence[TrialRow], path: tuple[str, ...]) -> list[tuple[float, float, int]]:
    points = []
    for row in rows:
        loss, x = row.loss_for_front, row.estimate(*path)
        if loss is not None and x is not None:
            points.append((loss, x, row.number))
    return points
