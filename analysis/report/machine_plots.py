"""How the time model did and what the machine delivered: durations, throughput, memory."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.report.canvas import CYCLE, MARKERS, Section, fmt, new_figure, save
from analysis.report.rows import GIB, NEVER_TRAINED, FullRun, TrialRow
from common.fmt import format_duration

DURATIONS, THROUGHPUT, MEMORY = "durations.png", "throughput.png", "memory.png"


def durations(rows: Sequence[TrialRow], folder: Path, full_runs: Sequence[FullRun] = ()) -> Section:
    """Predicted (p10-p90 bars) against measured seconds of every trained trial and full run."""
    title = "Predicted against measured duration"
    trials = []
    for row in rows:
        predicted = row.number_attr("predicted_trial_seconds")
        measured = row.number_attr("measured_trial_seconds")
        if row.state != NEVER_TRAINED and predicted and measured:
            band = (
                row.number_attr("predicted_trial_seconds_p10"),
                predicted,
                row.number_attr("predicted_trial_seconds_p90"),
            )
            trials.append((band, measured))
    runs = [(run.predicted, run.seconds) for run in full_runs if run.predicted[1]]
    if not trials and not runs:
        return Section(
            title,
            None,
            "Skipped: no trained trial records predicted and measured "
            "seconds (`predicted_trial_seconds`, `measured_trial_seconds`).",
        )
    fig, (ax,) = new_figure()
    for points, style in (
        (trials, ("o", "tab:blue", "trial")),
        (runs, ("*", "tab:red", "full run")),
    ):
        if points:
            _with_bars(ax, points, *style)
    values = [v for (_, p50, _), m in trials + runs for v in (p50 or m, m)]
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], color="0.5", lw=1, ls="--", label="measured = predicted")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    _duration_ticks(ax)
    ax.set_xlabel("predicted duration (p50, bars p10-p90)")
    ax.set_ylabel("measured duration")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, folder / DURATIONS)

    parts = []
    if trials:
        inside = sum(1 for (p10, _, p90), m in trials if p10 and p90 and p10 <= m <= p90)
        ratios = [m / p50 for (_, p50, _), m in trials if p50]
        parts.append(
            f"{inside} of {len(trials)} trials took a time inside the predicted p10-p90 band; "
            f"measured/predicted median x{statistics.median(ratios):.2f} "
            f"(x{min(ratios):.2f}-x{max(ratios):.2f})"
        )
    for (_, p50, _), seconds in runs:
        parts.append(
            f"a full run took {format_duration(seconds)} against "
            f"{format_duration(p50 or 0.0)} predicted"
        )
    skipped = len(full_runs) - len(runs)
    if skipped:
        parts.append(f"{skipped} full run(s) without a prediction are not shown")
    return Section(title, DURATIONS, "; ".join(parts) + ".")


def _duration_ticks(ax: Any) -> None:
    """Log axes labelled as people read durations (42 s, 3.3 min, 14.2 h), at 1-2-5 steps."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda value, _: format_duration(value)))
        axis.set_minor_formatter(NullFormatter())


def _with_bars(ax: Any, points: list[Any], marker: str, colour: str, label: str) -> None:
    xs = [p50 for (_, p50, _), _ in points]
    ys = [measured for _, measured in points]
    lower = [p50 - p10 if p10 is not None else 0.0 for (p10, p50, _), _ in points]
    upper = [p90 - p50 if p90 is not None else 0.0 for (_, p50, p90), _ in points]
    ax.errorbar(
        xs,
        ys,
        xerr=[lower, upper],
        fmt=marker,
        color=colour,
        ms=6 if marker == "o" else 12,
        capsize=2,
        elinewidth=1,
        label=label,
    )


def _trained(rows: Sequence[TrialRow]) -> list[TrialRow]:
    return [row for row in rows if row.state != NEVER_TRAINED and row.state != "running"]


def throughput(rows: Sequence[TrialRow], folder: Path) -> Section:
    """Tokens/s against micro-batch size and accumulation, one marker and colour per profile."""
    title = "Throughput by batch shape and profile"
    measured = [
        row
        for row in _trained(rows)
        if (row.number_attr("tokens_per_second") or 0) > 0
        and row.number_attr("micro_batch_size")
        and row.number_attr("gradient_accumulation_steps")
    ]
    if not measured:
        return Section(
            title,
            None,
            "Skipped: no trained trial records `tokens_per_second` with "
            "its `micro_batch_size` and `gradient_accumulation_steps`.",
        )
    fig, axes = new_figure(2)
    profiles = sorted({str(row.attrs.get("profile", "-")) for row in measured})
    for index, profile in enumerate(profiles):
        group = [row for row in measured if str(row.attrs.get("profile", "-")) == profile]
        style = {"marker": MARKERS[index % len(MARKERS)], "color": CYCLE[index % len(CYCLE)]}
        speeds = [row.number_attr("tokens_per_second") for row in group]
        for ax, name in zip(axes, ("micro_batch_size", "gradient_accumulation_steps"), strict=True):
            ax.scatter(
                [row.number_attr(name) for row in group], speeds, label=profile, s=30, **style
            )
    for ax, name in zip(axes, ("micro-batch size", "gradient accumulation steps"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens per second (trial)")
    axes[0].legend(title="profile", fontsize=8)
    save(fig, folder / THROUGHPUT)

    def tps(row: TrialRow) -> float:
        return row.number_attr("tokens_per_second") or 0.0

    fastest, slowest = max(measured, key=tps), min(measured, key=tps)
    return Section(
        title,
        THROUGHPUT,
        (
            f"Highest throughput {tps(fastest):,.0f} tokens/s: trial {fastest.number} "
            f"({_shape(fastest)}); lowest {tps(slowest):,.0f} tokens/s: trial {slowest.number} "
            f"({_shape(slowest)})."
        ),
    )


def _shape(row: TrialRow) -> str:
    return (
        f"profile {row.attrs.get('profile', '-')}, micro-batch "
        f"{row.number_attr('micro_batch_size'):.0f}, accumulation "
        f"{row.number_attr('gradient_accumulation_steps'):.0f}"
    )


def memory(rows: Sequence[TrialRow], folder: Path) -> Section:
    """Predicted peak memory (the time model's estimate) against the measured peak."""
    title = "Predicted against measured peak memory"
    pairs = [
        (predicted, measured / GIB, row)
        for row in _trained(rows)
        if (predicted := row.estimate("peak_memory_gb"))
        and (measured := row.number_attr("peak_memory_bytes") or 0.0) > 0
    ]
    if not pairs:
        return Section(
            title,
            None,
            "Skipped: no trained trial records both `estimate.peak_memory_gb`"
            " and a measured `peak_memory_bytes`.",
        )
    fig, (ax,) = new_figure()
    ax.scatter(
        [p for p, _, _ in pairs], [m for _, m, _ in pairs], color="tab:blue", s=30, label="trial"
    )
    values = [v for p, m, _ in pairs for v in (p, m)]
    low, high = min(values) * 0.8, max(values) * 1.2
    ax.plot([low, high], [low, high], color="0.5", lw=1, ls="--", label="measured = predicted")
    ax.set(xlim=(low, high), ylim=(low, high))
    ax.set_xlabel("predicted peak memory, GiB (full run)")
    ax.set_ylabel("measured peak memory, GiB (trial)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, folder / MEMORY)
    ratios = [m / p for p, m, _ in pairs]
    largest = max(pairs, key=lambda pair: pair[1])
    return Section(
        title,
        MEMORY,
        (
            f"Measured peak memory is x{statistics.median(ratios):.2f} the prediction (median over "
            f"{len(pairs)} trials, x{min(ratios):.2f}-x{max(ratios):.2f}); the largest, "
            f"{fmt(largest[1])} GiB, was trial {largest[2].number}."
        ),
    )
