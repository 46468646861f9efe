"""How the search went: the optimization history, parameter importances, a slice view.

The importance and slice figures come from `optuna.visualization.matplotlib` (experimental:
it may warn or change); when it raises, a plain figure of our own stands in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.report.canvas import (
    BEST_COLOUR,
    HEIGHT_IN,
    STYLE,
    WIDTH_IN,
    Section,
    fmt,
    new_figure,
    pyplot,
    quiet,
    save,
)
from analysis.report.rows import TrialRow, best_complete, count, finite
from common.fmt import format_duration

if TYPE_CHECKING:
    import optuna

HISTORY, IMPORTANCES, SLICE = "history.png", "importances.png", "slice.png"
_MAX_SLICE_PARAMS = 3  # more panels do not fit 800 px


def history(rows: Sequence[TrialRow], folder: Path, *, minimize: bool = True) -> Section:
    """Value and best-so-far against trial number and elapsed time; other states marked."""
    title = "Optimization history"
    fig, (by_number, by_time) = new_figure(2)
    starts = [row.started for row in rows if row.started is not None]
    origin = min(starts) if starts else None

    def minutes(row: TrialRow) -> float | None:
        moment = row.finished or row.started
        if origin is None or moment is None:
            return None
        return (moment - origin).total_seconds() / 60.0

    for ax, x_of in ((by_number, lambda r: float(r.number)), (by_time, minutes)):
        xs = []
        for state, (marker, colour, label) in STYLE.items():
            group = [row for row in rows if row.state == state]
            xs += _scatter_state(ax, group, x_of, marker, colour, label)
        if xs:  # the rug's points do not widen the axis on their own
            pad = 0.04 * (max(xs) - min(xs)) or 0.5
            ax.set_xlim(min(xs) - pad, max(xs) + pad)
    complete = [row for row in rows if row.state == "complete" and row.value is not None]
    best_row = best_complete(rows, minimize=minimize)
    if best_row is None:
        raise ValueError("history needs at least one complete trial")
    pick = min if minimize else max
    for ax, key in ((by_number, lambda r: float(r.number)), (by_time, minutes)):
        ordered = sorted((x, float(r.value or 0.0)) for r in complete if (x := key(r)) is not None)
        best: list[float] = []
        for _, value in ordered:
            best.append(value if not best else pick(best[-1], value))
        ax.step([x for x, _ in ordered], best, where="post", color=BEST_COLOUR, label="best so far")
        ax.set_ylabel("objective value (predicted final loss)")
        ax.grid(alpha=0.3)
    by_number.set_xlabel("trial number")
    by_time.set_xlabel("elapsed minutes (trial finished)")
    handles, labels = by_number.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    save(fig, folder / HISTORY)

    counts = count(rows)
    when = minutes(best_row)
    after = f" after {format_duration(when * 60)}" if when is not None else ""
    others = [
        f"{counts['never_trained']} never trained (over the budget)",
        f"{counts['pruned']} pruned",
        f"{counts['failed']} failed",
    ]
    return Section(
        title,
        HISTORY,
        f"Best value {fmt(best_row.value or 0.0)} reached at trial {best_row.number} of "
        f"{len(rows)}{after}; {', '.join(others)}.",
    )


def _scatter_state(
    ax: Any, group: Sequence[TrialRow], x_of: Any, marker: str, colour: str, label: str
) -> list[float]:
    """Trials with a value as points; those without one as ticks along the bottom edge.

    Returns:
        The x of every trial drawn.
    """
    valued: list[tuple[float, float]] = []
    bare: list[float] = []
    for row in group:
        x = x_of(row)
        if x is None:
            continue
        y = row.value if row.state == "complete" else row.last_intermediate
        if y is None:
            bare.append(x)
        else:
            valued.append((x, y))
    if valued:
        ax.scatter(*zip(*valued, strict=True), marker=marker, color=colour, label=label, s=28)
    if bare:
        # x in data units, y in axes units: a rug just above the bottom edge.
        ax.scatter(
            bare,
            [0.03] * len(bare),
            marker=marker,
            color=colour,
            transform=ax.get_xaxis_transform(),
            s=28,
            clip_on=False,
            label=None if valued else label,
        )
    return [x for x, _ in valued] + bare


def importances(
    study: optuna.Study, rows: Sequence[TrialRow], folder: Path
) -> tuple[Section, dict[str, float]]:
    """fANOVA importances (Optuna); rank correlations of numeric parameters if that fails.

    Returns:
        The section and the importance of each parameter (empty when skipped).
    """
    title = "Parameter importances"
    n = sum(row.state == "complete" for row in rows)
    try:
        scores, fig = _optuna_importances(study)
        how = f"fANOVA over {n} complete trials"
    except Exception as exc:  # experimental API: any failure means the fallback
        scores = rank_correlations(rows)
        if not scores:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            skipped = (
                f"Skipped: no parameter varies over the {n} complete trials in a way "
                f"importances can measure ({reason})."
            )
            return Section(title, None, skipped), {}
        fig, (ax,) = new_figure()
        names = sorted(scores, key=scores.__getitem__)
        ax.barh(names, [scores[name] for name in names], color="tab:blue")
        ax.set_xlabel("|Spearman rank correlation| with the value")
        how = f"rank correlation over {n} complete trials; Optuna's fANOVA could not run"
    save(fig, folder / IMPORTANCES)
    ranked = sorted(scores.items(), key=lambda item: -item[1])
    head = f"{ranked[0][0]} matters most ({ranked[0][1]:.0%}"
    tail = f"; next {ranked[1][0]} ({ranked[1][1]:.0%})" if len(ranked) > 1 else ""
    return Section(title, IMPORTANCES, f"{head}, {how}){tail}."), dict(scores)


def _optuna_importances(study: optuna.Study) -> tuple[dict[str, float], Any]:
    import matplotlib
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    from optuna.visualization.matplotlib import plot_param_importances

    pyplot()
    with quiet(), matplotlib.rc_context():  # Optuna switches the global style to ggplot
        # Several objectives: importances for the first, the loss.
        target = _first_value if len(study.directions) > 1 else None
        scores = get_param_importances(
            study, evaluator=FanovaImportanceEvaluator(seed=0), target=target
        )
        ax = plot_param_importances(
            study,
            evaluator=FanovaImportanceEvaluator(seed=0),
            target=target,
            target_name="loss" if target else "Objective Value",
        )
        fig: Any = ax.figure
        fig.set_size_inches(WIDTH_IN, HEIGHT_IN)
        fig.tight_layout()  # long parameter names would be cut at the left edge
    return dict(scores), fig


def _first_value(trial: optuna.trial.FrozenTrial) -> float:
    return float(trial.values[0])


def rank_correlations(rows: Sequence[TrialRow]) -> dict[str, float]:
    """|Spearman rho| between each numeric parameter and the value, over complete trials.

    Needs three trials with the parameter; a parameter that never varies is left out.
    """
    from scipy.stats import spearmanr

    complete = [row for row in rows if row.state == "complete" and row.value is not None]
    names = sorted({name for row in complete for name in row.params})
    scores = {}
    for name in names:
        pairs = [(x, row.value) for row in complete if (x := finite(row.params.get(name)))]
        if len(pairs) < 3 or len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
            continue
        rho = finite(spearmanr(*zip(*pairs, strict=True)).statistic)
        if rho is not None:
            scores[name] = abs(rho)
    return scores


def slices(
    study: optuna.Study,
    rows: Sequence[TrialRow],
    folder: Path,
    *,
    importance: dict[str, float],
    minimize: bool = True,
) -> Section:
    """The value against each of the most important parameters (Optuna's slice plot).

    Args:
        study: The study.
        rows: Its trials.
        folder: Where the PNG goes.
        importance: Each parameter's importance (orders the panels; may be empty).
        minimize: The study's direction.
    """
    title = "Parameter slice"
    complete = [row for row in rows if row.state == "complete" and row.value is not None]
    best = best_complete(rows, minimize=minimize)
    params = _slice_params(complete, importance)
    if best is None or not params:
        return Section(title, None, "Skipped: the complete trials have no parameters.")
    try:
        fig = _optuna_slice(study, params)
    except Exception:  # experimental API: draw the same view ourselves
        fig = _own_slice(complete, [p for p in params if finite(best.params.get(p)) is not None])
    save(fig, folder / SLICE)
    shown = ", ".join(f"{p} {_show(best.params.get(p))}" for p in params)
    return Section(
        title, SLICE, f"Best trial {best.number} used {shown}; each dot is one complete trial."
    )


def _slice_params(complete: Sequence[TrialRow], importance: dict[str, float]) -> list[str]:
    """Up to four parameters, most important first (present in every complete trial)."""
    common = set.intersection(*(set(row.params) for row in complete)) if complete else set()
    order = sorted(importance.items(), key=lambda item: -item[1])
    ranked = [name for name, _ in order if name in common]
    ranked += sorted(common - set(ranked))
    return ranked[:_MAX_SLICE_PARAMS]


def _optuna_slice(study: optuna.Study, params: list[str]) -> Any:
    import matplotlib
    import numpy as np
    from matplotlib.ticker import NullFormatter
    from optuna.visualization.matplotlib import plot_slice

    pyplot()
    with quiet(), matplotlib.rc_context():
        axes = plot_slice(study, params=params)
    panels = list(axes.ravel()) if isinstance(axes, np.ndarray) else [axes]
    for ax in panels:  # sized for our width: log axes' minor labels would overlap
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="x", labelsize=8)
    return panels[0].figure


def _own_slice(complete: Sequence[TrialRow], params: list[str]) -> Any:
    fig, axes = new_figure(max(len(params), 1))
    for ax, name in zip(axes, params, strict=False):
        points = [(x, r.value) for r in complete if (x := finite(r.params.get(name))) is not None]
        ax.scatter(*zip(*points, strict=True), color="tab:blue", s=20)
        ax.set_xlabel(name)
        if all(x > 0 for x, _ in points) and max(x for x, _ in points) > 30 * min(
            x for x, _ in points
        ):
            ax.set_xscale("log")
    axes[0].set_ylabel("objective value")
    return fig


def _show(value: object) -> str:
    number = finite(value)
    return fmt(number) if number is not None else str(value)
