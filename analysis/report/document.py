"""Draw every section of a study's report into a folder, with a `report.md` that embeds them.

The folder appears whole or not at all: everything is written into a hidden staging folder
next to it, which is then renamed into place (a previous report is replaced only then).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

# The plot modules by their own names, not through this package (its __init__ imports this
# module: naming the package here would be an import cycle).
import analysis.report.loss_plots as loss_plots
import analysis.report.machine_plots as machine_plots
import analysis.report.search_plots as search_plots
from analysis.calibration.full_runs import MEASURED_PREFIX
from analysis.report.canvas import Section
from analysis.report.rows import FullRun, TrialRow, best_complete, count, trial_rows
from analysis.study_keys import (
    CONFIG_ATTR,
    END_PREDICTIONS_ATTR,
    EXPERIMENT_ATTR,
    EXPORTED_ATTR,
    PARENT_ATTR,
    SEARCH_ATTR,
)
from common.errors import BadInputError
from common.files import replace_folder, write_atomic
from common.fmt import format_hours
from common.redact import redact

if TYPE_CHECKING:
    import optuna

REPORT_MD = "report.md"


@dataclass(frozen=True)
class Report:
    """What `write_report` wrote.

    Attributes:
        folder: The report folder (attach it whole, e.g. as MLflow artifacts under `report/`).
        markdown: `report.md` inside it.
        images: The PNGs, in the order report.md shows them.
        skipped: Titles of the sections drawn without an image, each with its reason.
    """

    folder: Path
    markdown: Path
    images: tuple[Path, ...]
    skipped: tuple[str, ...]


def write_report(
    study: optuna.Study,
    out_dir: str | Path,
    *,
    full_runs: Sequence[FullRun] = (),
    tracking_uri: str | None = None,
) -> Report:
    """Write the study's plots and `report.md` into `out_dir` (replacing a previous report).

    Args:
        study: The study (single objective, or loss first and hours or cost second).
        out_dir: The report folder; its parent is created when missing.
        full_runs: Full training runs to compare with their predicted durations.
        tracking_uri: The MLflow tracking URI, to link the study's runs (http(s) only).

    Returns:
        The folder, report.md and the images.

    Raises:
        BadInputError: The study has no complete trial, or `out_dir` is not a folder.
    """
    rows = trial_rows(study.get_trials(deepcopy=False), study.user_attrs.get(END_PREDICTIONS_ATTR))
    # A multi-objective study (loss and hours or cost) is read by its first objective, the
    # loss; the Pareto plot shows the trade-off.
    minimize = study.directions[0].name == "MINIMIZE"
    best = best_complete(rows, minimize=minimize)
    if best is None:
        counts = ", ".join(
            f"{n} {state.replace('_', ' ')}" for state, n in count(rows).items() if n
        )
        raise BadInputError(
            f"study '{study.study_name}' has no complete trial to report on ({counts or 'no trials'})"
        )
    target = Path(out_dir).absolute()
    if target.exists() and not target.is_dir():
        raise BadInputError(f"--out {out_dir}: exists and is not a folder")
    exported = study.user_attrs.get(EXPORTED_ATTR)
    if isinstance(exported, bool) or not isinstance(exported, int):
        exported = best.number
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; a report is for reading
        sections = _draw(study, rows, staging, minimize, exported, full_runs)
        text = _markdown(study, rows, sections, best, exported, tracking_uri)
        write_atomic(staging / REPORT_MD, text)
        replace_folder(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return Report(
        folder=target,
        markdown=target / REPORT_MD,
        images=tuple(target / s.image for s in sections if s.image),
        skipped=tuple(f"{s.title}: {s.reading}" for s in sections if not s.image),
    )


def _draw(
    study: optuna.Study,
    rows: Sequence[TrialRow],
    folder: Path,
    minimize: bool,
    exported: int,
    full_runs: Sequence[FullRun],
) -> list[Section]:
    importances, scores = search_plots.importances(study, rows, folder)
    return [
        search_plots.history(rows, folder, minimize=minimize),
        importances,
        search_plots.slices(study, rows, folder, importance=scores, minimize=minimize),
        loss_plots.curves(rows, folder, minimize=minimize),
        machine_plots.durations(rows, folder, full_runs),
        machine_plots.throughput(rows, folder),
        machine_plots.memory(rows, folder),
        loss_plots.pareto(rows, folder, exported=exported),
    ]


def _markdown(
    study: optuna.Study,
    rows: Sequence[TrialRow],
    sections: Iterable[Section],
    best: TrialRow,
    exported: int,
    tracking_uri: str | None,
) -> str:
    counts = count(rows)
    tally = ", ".join(f"{n} {state.replace('_', ' ')}" for state, n in counts.items() if n)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Study report: {study.study_name}",
        "",
        f"{len(rows)} trials ({tally}); {_directions(study)}; "
        f"best trial {best.number} (value {best.value:.4g}); exported trial {exported}. "
        f"Written {now}.",
        "",
    ]
    link = _mlflow_line(study.user_attrs, tracking_uri)
    if link:
        lines += [link, ""]
    measured = measured_line(study.user_attrs)
    if measured:
        lines += [measured, ""]
    trl = trl_line(study.user_attrs)
    if trl:
        lines += [trl, ""]
    search = search_line(study.user_attrs.get(SEARCH_ATTR))
    if search:
        lines += [search, ""]
    for index, section in enumerate(sections, start=1):
        lines += [f"## {index}. {section.title}", ""]
        if section.image:
            lines += [f"![{section.title}]({section.image})", "", section.reading, ""]
        else:
            lines += [f"_{section.reading}_", ""]
    return "\n".join(lines)


def measured_line(study_attrs: Mapping[str, object]) -> str | None:
    """The full runs of the study's trials that reported back and what they measured (the
    study's `MEASURED_PREFIX` attributes), by trial; None without any."""
    runs = []
    for key, value in study_attrs.items():
        if key.startswith(MEASURED_PREFIX) and isinstance(value, Mapping):
            trial, loss = value.get("trial"), value.get("loss")
            if isinstance(trial, int) and isinstance(loss, (int, float)):
                best = value.get("best_step")  # early stopping ended it: its best evaluation
                early = f", stopped early, its best at step {best}" if isinstance(best, int) else ""
                runs.append((trial, float(loss), key.removeprefix(MEASURED_PREFIX), early))
    if not runs:
        return None
    listed = "; ".join(
        f"trial {trial}: {loss:.4f} (MLflow run {run}{early})"
        for trial, loss, run, early in sorted(runs)
    )
    return f"Full runs reported back, final validation loss measured: {listed}."


def trl_line(study_attrs: Mapping[str, object]) -> str | None:
    """The study's presets trained by `trl sft` that reported back: each run's `train_runtime`
    against the estimate (`hpo.full_run_reports.TrlRun`); None without any."""
    from analysis.calibration.full_runs import trl_runs

    runs = trl_runs(study_attrs)
    if not runs:
        return None
    listed = "; ".join(run.line() for run in runs)
    return f"Presets trained by trl sft, duration without the model's load: {listed}."


def search_line(search: object, width: int = 20) -> str | None:
    """The search's spend against its budget (or plan), with a text bar: `|` marks 100 %."""
    if not isinstance(search, Mapping) or "spent_hours" not in search:
        return None
    budget = search.get("budget_hours")
    limit = float(budget or search.get("planned_hours") or 0.0)
    spent = float(search["spent_hours"])
    what = "budget" if budget else "plan"
    planned = float(search.get("planned_hours") or 0.0)
    text = (
        f"Search: spent {format_hours(spent, minute_decimals=0)} against a {what} of "
        f"{format_hours(limit, minute_decimals=0)} "
        f"(planned {format_hours(planned, minute_decimals=0)}); "
        f"ended by {search.get('ended_by', '?')}."
    )
    if limit <= 0:
        return text
    filled = min(2 * width, round(width * spent / limit))
    bar = "#" * min(filled, width) + "." * max(0, width - filled)
    bar += "|" + "#" * max(0, filled - width)
    return f"{text} `[{bar}]` {spent / limit:.0%} of the {what}."


def _directions(study: optuna.Study) -> str:
    if len(study.directions) == 1:
        return f"direction {study.direction.name.lower()}"
    names = (study.user_attrs.get(CONFIG_ATTR) or {}).get("objectives") or []
    if len(names) != len(study.directions):
        names = [f"objective {i}" for i in range(len(study.directions))]
    return "Pareto front of " + " and ".join(
        f"{name} ({d.name.lower()})" for name, d in zip(names, study.directions, strict=True)
    )


def _mlflow_line(attrs: Mapping[str, object], tracking_uri: str | None) -> str | None:
    """Where the study's MLflow parent run is (a link when the tracking URI is a server)."""
    run, experiment = attrs.get(PARENT_ATTR), attrs.get(EXPERIMENT_ATTR)
    if not run:
        return None
    if tracking_uri and tracking_uri.startswith(("http://", "https://")) and experiment:
        base = redact(tracking_uri).rstrip("/")
        return f"MLflow parent run: [{run}]({base}/#/experiments/{experiment}/runs/{run})"
    return f"MLflow parent run: `{run}` (experiment {experiment or '?'})"
