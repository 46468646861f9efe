"""What `python -m trainers.train` prints at the end: results, the window, how to resume."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from common.fmt import format_duration
from trainers.loop.window import WindowGuard
from trainers.preset import departure_line
from trainers.result import TrainResult


def predicted_seconds(estimate: dict[str, Any]) -> float | None:
    """The preset's predicted full-run duration (median), in seconds, when it has one."""
    duration = estimate.get("duration_hours")
    p50 = duration.get("p50") if isinstance(duration, dict) else duration
    return float(p50) * 3600 if isinstance(p50, (int, float)) and p50 > 0 else None


def loss_line(result: TrainResult, band: Mapping[str, Any] | None) -> str | None:
    """The finished run's final validation loss against its preset's p10-p90; None without
    both. A run that stopped early is read by its best evaluation (the checkpoint it keeps,
    and what its study takes as the configuration's loss: `hpo.full_run_reports`)."""
    early = result.status == "stopped_early" and result.best_step is not None
    measured = result.best_val_loss if early else result.final_eval_loss
    if not (result.status == "finished" or early) or measured is None:
        return None
    if not isinstance(band, Mapping):
        return None
    try:
        p10, p50, p90 = (float(band[q]) for q in ("p10", "p50", "p90"))
    except (KeyError, TypeError, ValueError):  # a preset edited by hand: nothing to compare
        return None
    if not p50 > 0:
        return None
    where = _where(measured, p10, p90)
    predicted = f"predicted {p50:.4f} (p10-p90 {p10:.4f} to {p90:.4f})"
    if early:
        return (
            f"validation loss: {predicted} at the schedule's end, best {measured:.4f} at step "
            f"{result.best_step:,} of {result.total_steps:,} before it stopped early "
            f"(x{measured / p50:.2f}, {where})"
        )
    return f"final validation loss: {predicted}, measured {measured:.4f} (x{measured / p50:.2f}, {where})"


def _where(value: float, p10: float, p90: float) -> str:
    return "inside p10-p90" if p10 <= value <= p90 else "above p90" if value > p90 else "below p10"


def _seconds_band(hours: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """The p10 and p90 of a preset's `duration_hours`, in seconds; None without both."""
    if not isinstance(hours, Mapping):
        return None
    try:
        low, high = float(hours["p10"]) * 3600, float(hours["p90"]) * 3600
    except (KeyError, TypeError, ValueError):
        return None
    return (low, high) if 0 < low <= high else None


def resume_command(argv: list[str]) -> str:
    """The exact command that resumes this run: same interpreter, folder and flags."""
    args = [a for a in argv if a != "--resume"]
    command = shlex.join([sys.executable, "-m", "trainers.train", *args, "--resume"])
    return f"cd {shlex.quote(os.getcwd())} && {command}"


def summary_lines(
    result: TrainResult,
    guard: WindowGuard,
    *,
    predicted_loss: Mapping[str, Any] | None = None,
    predicted_duration: Mapping[str, Any] | None = None,
    departed: Mapping[str, Any] | None = None,
) -> list[str]:
    """A few lines: steps, speed and losses; predicted vs actual; a window stop; recoveries.

    Args:
        result: The run.
        guard: Its window.
        predicted_loss: The preset's predicted final validation loss (p10, p50, p90), for a
            run that changed nothing it depends on.
        predicted_duration: The preset's `duration_hours`: its p10-p90 beside the duration
            line, which needs `result.predicted_seconds` (None for a departed run).
        departed: What the run changed over its preset (`trainers.preset.departures`).
    """
    train_loss = result.final_train_loss
    lines = [
        f"{result.optimizer_steps} steps in {result.wall_seconds:.1f} s "
        f"({result.tokens_per_second:,.0f} tokens/s on {result.device}/{result.precision}); "
        + (f"final train loss {train_loss:.4f}" if train_loss is not None else "no step finished")
    ]
    if result.eval_losses:
        first, last = result.eval_losses[0][1], result.eval_losses[-1][1]
        lines[0] += f"; validation loss {first:.4f} -> {last:.4f}"
    if result.resumed_from_step is not None:
        lines.append(f"resumed from step {result.resumed_from_step}")
    for reason in result.recoveries:
        lines.append(f"recovered: {reason}")
    if departed:
        lines.append(departure_line(departed))
    if result.status == "finished" and result.predicted_seconds:
        actual = result.cumulative_wall_seconds
        band, where = "", ""
        if (low_high := _seconds_band(predicted_duration)) is not None:
            low, high = low_high
            band = f" (p10-p90 {format_duration(low)} to {format_duration(high)})"
            where = ", " + _where(actual, low, high)
        lines.append(
            f"duration: predicted {format_duration(result.predicted_seconds)}{band}, actual "
            f"{format_duration(actual)} (x{actual / result.predicted_seconds:.2f}{where})"
        )
    if (line := loss_line(result, predicted_loss)) is not None:
        lines.append(line)
    if result.status == "stopped_by_window" and guard.window_seconds is not None:
        lines.append(
            f"stopped by the time window at step {result.final_step:,} of "
            f"{result.total_steps:,} (window {format_duration(guard.window_seconds)}, margin "
            f"{format_duration(guard.margin_seconds)}); checkpoint: {result.checkpoint_dir}"
        )
    elif result.status == "stopped_by_signal":
        lines.append(
            f"stopped by {result.stop_reason} at step {result.final_step:,} of "
            f"{result.total_steps:,}; checkpoint: {result.checkpoint_dir}"
        )
    elif result.status == "stopped_early":
        lines.append(
            f"stopped early at step {result.final_step:,} of {result.total_steps:,}: "
            f"{result.stop_reason}"
        )
    elif result.checkpoint_dir:
        lines.append(f"checkpoint: {result.checkpoint_dir}")
    if result.best_step is not None and result.best_val_loss is not None:
        where = f"; checkpoint: {result.best_checkpoint}" if result.best_checkpoint else ""
        lines.append(
            f"best validation loss {result.best_val_loss:.4f} at step {result.best_step}" + where
        )
    lines.extend(f"advice: {line}" for line in result.advice)
    return lines
