"""A study's report: PNGs of how the search went and what it predicts, and a `report.md`.

    python -m analysis.report --study-name NAME --storage URL --out DIR

`write_report(study, out_dir)` is the same from code (the study runner calls it at the end
of every study). The data behind each plot is extracted by plain functions (`rows`,
`pareto`) so it is tested without drawing; matplotlib is imported only when drawing.
"""

from __future__ import annotations

from analysis.report.document import REPORT_MD, Report, write_report
from analysis.report.pareto import cheapest_within, pareto_front
from analysis.report.rows import FullRun, TrialRow, read_full_runs, trial_rows

__all__ = [
    "REPORT_MD",
    "FullRun",
    "Report",
    "TrialRow",
    "cheapest_within",
    "pareto_front",
    "read_full_runs",
    "trial_rows",
    "write_report",
]
