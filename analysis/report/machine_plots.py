"""How the time model did and what the machine delivered: durations, throughput, memory."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.report.canvas import CYCLE, MARKERS, Section, fmt, new_figure, save
from analysis.report.rows import GIB, NEVER_TRAINED, FullRun, TrialRow
from common.fmt import format_duration

DURATIONS, THROUGHPUT, MEMORY = "durations.png", "throughput.png", "memory.png"


# The point of each kind: marker, colour, legend label.
_COMPLETE_STYLE = ("o", "tab:blue", "trial, all its steps")
_PRUNED_STYLE = ("x", "tab:orange", "pruned trial, the steps it ran")
_FULL_RUN_STYLE = ("*", "tab:red", "full run")


@dataclass(frozen=True)
class Timed:
    """A run's predicted band (p10, p50, p90) and measured seconds."""

    band: tuple[float | None, float, float | None]
    measured: float


@dataclass
class TrialTimes:
    """Trained trials, compared with the prediction for the steps each one trained."""

    complete: list[Timed] = field(default_factory=list)  # trained all their steps
    pruned: list[Timed] = field(default_factory=list)
    left_out: int = 0  # a prediction for other steps than those trained
    # (measured, predicted) seconds of the optimizer steps alone, where recorded.
    steps_only: list[tuple[float, float]] = field(default_factory=list)

    @property
    def all(self) -> list[Timed]:
        return self.complete + self.pruned


def trial_times(rows: Sequence[TrialRow]) -> TrialTimes:
    """Each trained trial's measured seconds against the prediction for the steps it trained.

    A pruned trial stopped before its end: the study predicts it again for the steps it ran
    (`predicted_trial_steps`, equal to its `trained_steps`), so it is compared like with like.
    A trial whose prediction is recorded for other steps than it trained is left out and
    counted apart. Records without `predicted_trial_steps` come from studies that already
    predicted the trained steps but did not say so: they are taken as they are.
    """
    out = TrialTimes()
    for row in rows:
        predicted = row.number_attr("predicted_trial_seconds")
        measured = row.number_attr("measured_trial_seconds")
        if row.state in (NEVER_TRAINED, "running") or not predicted or not measured:
            continue
        steps = row.number_attr("predicted_trial_steps")
        trained = row.number_attr("trained_steps")
        if steps is not None and trained is not None and round(steps) != round(trained):
            out.left_out += 1
            continue
        band = (
            row.number_attr("predicted_trial_seconds_p10"),
            predicted,
            row.number_attr("predicted_trial_seconds_p90"),
        )
        (out.pruned if row.state == "pruned" else out.complete).append(Timed(band, measured))
        steps_predicted = row.number_attr("predicted_trial_train_seconds")
        steps_measured = row.number_attr("steps_seconds")
        if steps_predicted and steps_measured:
            out.steps_only.append((steps_measured, steps_predicted))
    return out


def durations(rows: Sequence[TrialRow], folder: Path, full_runs: Sequence[FullRun] = ()) -> Section:
    """Predicted (p10-p90 bars) against measured seconds of every trained trial and full run.

    Each trial is compared with the prediction for the steps it trained (`trial_times`).
    """
    title = "Predicted against measured duration"
    times = trial_times(rows)
    runs = [
        Timed((run.predicted[0], p50, run.predicted[2]), run.seconds)
        for run in full_runs
        if (p50 := run.predicted[1])
    ]
    if not times.all and not runs:
        return Section(
            title,
            None,
            "Skipped: no trained trial records predicted and measured "
            "seconds (`predicted_trial_seconds`, `measured_trial_seconds`) for the same steps.",
        )
    fig, (ax,) = new_figure()
    for points, style in (
        (times.complete, _COMPLETE_STYLE),
        (times.pruned, _PRUNED_STYLE),
        (runs, _FULL_RUN_STYLE),
    ):
        if points:
            _with_bars(ax, points, *style)
    values = [v for point in times.all + runs for v in (point.band[1], point.measured)]
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], color="0.5", lw=1, ls="--", label="measured = predicted")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    duration_ticks(ax)
    ax.set_xlabel("predicted duration of the steps trained (p50, bars p10-p90)")
    ax.set_ylabel("measured duration")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, folder / DURATIONS)

    parts = []
    if times.all or times.left_out:
        parts.append(_trials_text(times))
    for run in runs:
        parts.append(
            f"a full run took {format_duration(run.measured)} against "
            f"{format_duration(run.band[1])} predicted"
        )
    skipped = len(full_runs) - len(runs)
    if skipped:
        parts.append(f"{skipped} full run(s) without a prediction are not shown")
    return Section(title, DURATIONS, "; ".join(parts) + ".")


def _trials_text(times: TrialTimes) -> str:
    """How many trials of each kind were compared, and how far off the time model was."""
    text = (
        "Each trial against the prediction for the steps it trained: "
        f"{len(times.complete)} trained all their steps, {len(times.pruned)} "
        f"{'was' if len(times.pruned) == 1 else 'were'} pruned (stopped early: compared with "
        "the prediction for the steps they ran, not for a whole trial)"
    )
    if times.left_out:
        text += f"; {times.left_out} left out (predicted for other steps than they trained)"
    if not times.all:
        return text
    inside = sum(
        1
        for t in times.all
        if t.band[0] is not None and t.band[2] is not None and t.band[0] <= t.measured <= t.band[2]
    )
    text += (
        f". {inside} of {len(times.all)} took a time inside the predicted p10-p90 band; "
        f"measured/predicted {_ratios([(t.measured, t.band[1]) for t in times.all])}"
    )
    if times.complete and times.pruned:
        text += (
            f"; medians by kind: all steps x{_median(times.complete):.2f}, "
            f"pruned x{_median(times.pruned):.2f}"
        )
    if times.steps_only:
        text += (
            f". On the optimizer steps alone (start-up, evaluations and saves left out), "
            f"measured/predicted {_ratios(times.steps_only)} over {len(times.steps_only)} trials"
        )
    return text


def _median(points: Sequence[Timed]) -> float:
    return statistics.median(point.measured / point.band[1] for point in points)


def _ratios(pairs: Sequence[tuple[float, float]]) -> str:
    """`median x1.05 (x0.80-x1.30)` of measured / predicted."""
    ratios = [measured / predicted for measured, predicted in pairs]
    return f"median x{statistics.median(ratios):.2f} (x{min(ratios):.2f}-x{max(ratios):.2f})"


def duration_ticks(ax: Any) -> None:
    """Log axes labelled as people read durations (250 ms, 42 s, 3.3 min, 14.2 h), at 1-2-5."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda value, _: format_duration(value)))
        axis.set_minor_formatter(NullFormatter())


def _with_bars(ax: Any, points: list[Timed], marker: str, colour: str, label: str) -> None:
    xs = [point.band[1] for point in points]
    ys = [point.measured for point in points]
    lower = [p50 - p10 if p10 is not None else 0.0 for p10, p50, _ in (p.band for p in points)]
    upper = [p90 - p50 if p90 is not None else 0.0 for _, p50, p90 in (p.band for p in points)]
    ax.errorbar(
        xs,
        ys,
        xerr=[lower, upper],
        fmt=marker,
        color=colour,
        ms=12 if marker == "*" else 6,
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
