"""`python -m hpo.study`: search LoRA configurations that fit the time budget.

With no arguments it runs the embedded demo study (tiny model, bundled data, SQLite for
Optuna and MLflow under ./hpo-runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from common.cli import EXIT_OK, check_writable, check_writable_dir, run_cli
from common.errors import BadInputError
from common.files import write_json
from common.flags import FieldFlags, add_field_flags
from common.redact import redact_values
from hpo.config import StudyConfig, load_config, mlflow_defaults


def build_parser() -> tuple[argparse.ArgumentParser, FieldFlags]:
    """The parser: one flag per `StudyConfig` field, plus the command's own flags."""
    parser = argparse.ArgumentParser(
        prog="python -m hpo.study",
        description="Find the best LoRA configuration that fits a time budget (Optuna + MLflow).",
    )
    parser.add_argument("--config", help="Study YAML; flags override its values.")
    flags = add_field_flags(parser, StudyConfig)
    parser.add_argument("--json", help="Write the study's result to this JSON file.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Local worker processes of this study (one GPU each on a multi-GPU host); "
        "needs a PostgreSQL or journal: storage. Default: 1.",
    )
    return parser, flags


def main(argv: list[str] | None = None) -> int:
    parser, flags = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    config = load_config(args.config, flags.given(args))
    check_writable_dir(config.work_dir, "work_dir")
    if args.json:
        check_writable(args.json)
    _check_tracking_server(config)

    from hpo.runner import run_study
    from hpo.search_budget import seconds_since_launch
    from hpo.summary import print_summary
    from hpo.workers import run_workers

    if args.workers < 1:
        raise BadInputError(f"--workers must be >= 1, but got {args.workers}")
    if args.workers == 1:
        _say_idle_gpus(config)
    else:
        finished = run_workers(config, args.workers, argv)
        # The summary of the whole study, from this process: no trial is added.
        config = dataclasses.replace(config, n_trials=max(1, min(config.n_trials, finished)))
    summary = run_study(
        config,
        progress=not args.no_progress and args.workers == 1,
        # The imports are search time too (not the workers' time: they keep their own).
        since_launch=seconds_since_launch() if args.workers == 1 else 0.0,
        after_workers=args.workers != 1,
    )
    if args.json:
        write_json(args.json, redact_values(summary.to_dict()))
    print_summary(summary, mlflow_defaults().get("server") or {})
    return EXIT_OK


def _say_idle_gpus(config: StudyConfig) -> None:
    """On a host with several GPUs, say that `--workers` would use them (on stderr, at the
    start: a study can take hours, and it is the moment to stop and start it that way)."""
    from common.workdir import WorkDir
    from hpo.workers import idle_gpus_hint, visible_gpus

    hint = idle_gpus_hint(
        visible_gpus(config.device), 1, config.storage_url, str(WorkDir(config.work_dir).journal)
    )
    if hint:
        print(hint, file=sys.stderr, flush=True)


def _check_tracking_server(config: StudyConfig) -> None:
    """A tracking server that must answer (`--tracking-outage fail`): asked before any store
    is written, so a refused start leaves no study behind."""
    uri = config.tracking.uri or ""
    if config.tracking.outage != "fail":
        return
    if uri.startswith(("http://", "https://")):
        from hpo.tracking import Tracker

        Tracker.for_study(config, spool=False)  # raises when it does not answer


if __name__ == "__main__":
    sys.exit(run_cli(main))
