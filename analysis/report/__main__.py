"""`python -m analysis.report`: a study's plots and a short report.md, written into a folder.

    python -m analysis.report --study-name NAME --storage URL --out DIR
        [--tracking-uri URI] [--full-run RESULT.json ...]

Exit codes: 0 written; 2 bad input (no such study, storage unreachable, no complete trial,
a bad --full-run file), with one line on stderr and nothing written; 1 anything else.
"""

from __future__ import annotations

import argparse
import sys

from analysis.report.document import write_report
from analysis.report.rows import read_full_runs
from analysis.studies import load_study
from common.cli import EXIT_OK, check_writable, run_cli
from common.flags import study_parser
from common.redact import redact


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(
        "python -m analysis.report",
        "Write a study's plots (PNG) and a report.md that embeds them into a folder.",
    )
    parser.add_argument("--out", required=True, help="report folder (replaced when it exists)")
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI: report.md links the study's run there"
    )
    parser.add_argument(
        "--full-run",
        action="append",
        default=[],
        metavar="FILE",
        help="result JSON of a full run (python -m trainers.train --json); repeatable",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_writable(args.out)
    full_runs = read_full_runs(args.full_run)
    study = load_study(args.study_name, args.storage)
    report = write_report(study, args.out, full_runs=full_runs, tracking_uri=args.tracking_uri)
    print(f"report: {report.markdown} ({len(report.images)} images)")
    for skipped in report.skipped:
        print(f"  skipped {redact(skipped)}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_cli(main))
