"""`python -m trainers.train`: one LoRA training run from flags or a preset file.

The full run of a study's preset: inside its time window (it stops with a checkpoint before
the window closes and prints the command that resumes it), with checkpoints, recovery from
out-of-memory errors and a diverging loss, a progress bar and, optionally, an MLflow run.
A SIGTERM (preemption, eviction) stops it the same way, after the step under way.
With `gpus` N > 1 (a flag or the preset's), it trains data-parallel on N processes, one per
GPU: started through torchrun by this command (`trainers.launch`), or by the user's own
`torchrun --nproc-per-node N` / `accelerate launch`; process 0 alone writes the checkpoints,
the MLflow run, the summary and the JSON report.
Exit codes: 0 finished, 3 stopped by the window or a SIGTERM (resumable), 2 bad input,
1 gave up/crashed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.cli import EXIT_FAILED, EXIT_OK, check_writable, check_writable_dir, run_cli
from common.config import from_mapping
from common.errors import BadInputError, GaveUp
from common.files import read_yaml, write_json
from common.flags import FieldFlags, add_field_flags
from common.workdir import SPOOL_DIR, WorkDir
from trainers.launch import check_gpus, idle_gpus_hint, launch, report_exit, window_opened
from trainers.loop import distributed
from trainers.loop.preemption import StopOnSignal
from trainers.loop.window import WindowGuard
from trainers.preset import (
    DEFAULT_CHECKPOINT_MINUTES,
    DEFAULT_EARLY_STOPPING_PATIENCE,
    DEPARTS_TAG,
    Preset,
    changes_the_loss,
    departures,
    with_full_run_defaults,
)
from trainers.run_options import RunTracking, RunWindow
from trainers.run_summary import predicted_seconds, resume_command, summary_lines
from trainers.spec import TrainSpec

if TYPE_CHECKING:
    from trainers.data.dataset import DatasetStats

EXIT_RESUMABLE = 3  # stopped by the window or a signal, with a checkpoint
log = logging.getLogger(__name__)
DEFAULT_RUNS_DIR = "hpo-runs"  # the study's default work dir
MLFLOW_RUN_FILE = "mlflow_run.json"  # in the output dir: the run a resume continues
# Preset provenance -> tag of the full run's MLflow run (the names the study's runs use).
_PROVENANCE_TAGS = {
    "study": "hpo.study_name",
    "trial": "hpo.trial_number",
    "mlflow_parent_run_id": "hpo.parent_run_id",
    "mlflow_run_id": "hpo.trial_run_id",
}


def build_parser() -> tuple[argparse.ArgumentParser, FieldFlags]:
    """The parser: one flag per `TrainSpec` field, plus the command's own flags."""
    parser = argparse.ArgumentParser(
        prog="python -m trainers.train",
        description="Train LoRA adapters on a local causal LM, from flags or a preset file.",
        epilog="A preset states its full run's checkpoints, recovery and early stopping; flags "
        "override them. Without a preset, a full run saves a checkpoint every "
        f"{DEFAULT_CHECKPOINT_MINUTES:g} min unless a flag sets checkpoints, recovers from "
        "out-of-memory errors and a diverging loss unless --no-recovery is given, and stops "
        f"early after {DEFAULT_EARLY_STOPPING_PATIENCE} evaluations without improvement unless "
        "--early-stopping-patience says otherwise (0: off).",
    )
    parser.add_argument("--preset", help="Preset YAML exported by a study (python -m hpo.export).")
    flags = add_field_flags(parser, TrainSpec)
    parser.add_argument(
        "--resume", action="store_true", help="Continue from the newest valid checkpoint."
    )
    parser.add_argument("--json", help="Write the run's measurements to this JSON file.")
    parser.add_argument("--quiet", action="store_true", help="No progress bar.")
    window = parser.add_argument_group("time window (defaults from the preset's estimate)")
    add_field_flags(parser, RunWindow, group=window, show_defaults=False)
    window.add_argument(
        "--report-every",
        type=int,
        default=0,
        help="Steps between forecasts (0: every 1 %% of the run, at least 10).",
    )
    tracking = parser.add_argument_group("MLflow (off unless a tracking URI is given)")
    add_field_flags(parser, RunTracking, group=tracking)
    tracking.add_argument(
        "--register-model",
        metavar="NAME",
        help="Register the finished run's LoRA adapter (logged as the run's MLflow model) in "
        "the Model Registry under NAME, tagged with the study, trial and final loss.",
    )
    return parser, flags


def load_run(preset_path: str | None, given: dict[str, Any]) -> Preset:
    """The full run: the given flags over the preset (when there is one), else the flags alone.

    Its `spec` is what the run trains with: what the preset states for its full run and the
    flags say, and the full-run defaults (`with_full_run_defaults`) for what neither does.

    Args:
        preset_path: The preset file, if any; without one, estimate and provenance are empty.
        given: `TrainSpec` values from the command line, nested like it (`lora`, `recovery`).
    """
    from trainers.preset import on_gpus

    preset = _merged(preset_path, given)
    if preset_path:
        preset.spec = on_gpus(preset.spec, int(preset.stated.get("gpus", 1)), given)
    preset.spec = with_full_run_defaults(preset.spec, preset.given_with(given))
    return preset


def _merged(preset_path: str | None, given: dict[str, Any]) -> Preset:
    """The given flags over the preset (when there is one), else the flags alone."""
    from trainers.preset import load_preset

    if not preset_path:
        if not given.get("model") or not given.get("data"):
            raise BadInputError("give --preset FILE, or both --model and --data")
        return Preset(spec=TrainSpec.from_dict(given))
    nested = {key: value for key, value in given.items() if isinstance(value, dict)}
    flat = {key: value for key, value in given.items() if key not in nested}
    # Each preset trains into its own folder: two presets run one after the other from one
    # folder do not collide (--output-dir still decides).
    flat.setdefault("output_dir", default_output_dir(preset_path, _work_dir(preset_path)))
    preset = load_preset(preset_path, **flat)
    if nested:
        values = preset.spec.to_dict()
        for key, part in nested.items():
            values[key] = {**values[key], **part}
        preset.spec = TrainSpec.from_dict(values)
    return preset


def default_output_dir(preset_path: str | Path, work_dir: str | None = None) -> str:
    """Where a preset's full run goes without --output-dir: `full/<preset name>` in the work
    dir of the study it came from (`work_dir`, where that folder exists here), else in
    `hpo-runs`. A study given `--work-dir` on a large disk keeps its full run's checkpoints
    there, wherever the command is typed; a preset carried to another machine trains in
    `hpo-runs` there."""
    root = work_dir if work_dir and Path(work_dir).is_dir() else DEFAULT_RUNS_DIR
    return str(WorkDir(root).full_run(Path(preset_path).stem))


def _work_dir(preset_path: str) -> str | None:
    """The study's work dir its preset names (`provenance.work_dir`), if any."""
    try:
        provenance = read_yaml(preset_path).get("provenance")
    except BadInputError:
        return None  # load_preset names what is wrong with the file
    work_dir = provenance.get("work_dir") if isinstance(provenance, dict) else None
    return work_dir if isinstance(work_dir, str) else None


def check_start(spec: TrainSpec, resume: bool) -> DatasetStats:
    """What would refuse this start, checked before an MLflow run exists for it.

    Raises:
        BadInputError: A model folder without `config.json`, a data path that is not a file,
            an output folder that cannot be written, or that holds checkpoints without
            `--resume` (or none to resume), a malformed or empty data file.
    """
    from trainers.data.dataset import load_tokenized
    from trainers.data.sources import open_source
    from trainers.loop.run import _starting_checkpoint
    from trainers.model.lora import load_tokenizer

    model = Path(spec.model)
    if not (model / "config.json").is_file():
        what = "has no config.json" if model.is_dir() else "is not a folder"
        raise BadInputError(f"model {spec.model} {what}: give a transformers model folder")
    open_source(spec.data)  # a data file of a known type, or a folder of them or saved
    check_writable_dir(spec.output_dir, "output_dir")
    _starting_checkpoint(spec, resume)
    # Every record checked (and tokenized into the cache, where training finds it).
    return load_tokenized(spec.data_spec(), load_tokenizer(spec.model)).stats


def window_guard(
    args: argparse.Namespace, estimate: dict[str, Any], started_at: float
) -> WindowGuard:
    """The window and margin from the flags, else from the preset's estimate."""
    hours = _number("window_hours", getattr(args, "window_hours", None), estimate)
    flag_minutes = getattr(args, "safety_margin_minutes", None)
    minutes = _number("safety_margin_minutes", flag_minutes, estimate)
    if hours is None:
        minutes = flag_minutes  # the preset's margin is for its window
    window = RunWindow(  # checked as a study's budget is: no window is an endless one
        window_hours=math.inf if hours is None else hours, safety_margin_minutes=minutes or 0.0
    )
    if args.report_every < 0:
        raise BadInputError(f"report_every must be >= 0, but got {args.report_every=}")
    return WindowGuard(
        window_seconds=None if hours is None else window.window_hours * 3600,
        margin_seconds=window.safety_margin_minutes * 60,
        report_every=args.report_every,
        started_at=started_at,
    )


def _number(name: str, flag: float | None, estimate: dict[str, Any]) -> float | None:
    """The flag's value, else the preset estimate's (which must be a number)."""
    if flag is not None:
        return float(flag)
    value = estimate.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"preset estimate.{name} must be a number, but got {value!r}")
    return float(value)


def run_tracking(args: argparse.Namespace) -> RunTracking:
    """The MLflow flags, checked; `--register-model` needs a name and a tracking URI."""
    given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(RunTracking)}
    tracking = from_mapping(
        RunTracking, {k: v for k, v in given.items() if v is not None}, "tracking"
    )
    if args.register_model is not None and (
        not args.register_model.strip() or tracking.uri in (None, "", "off")
    ):
        raise BadInputError(
            f"--register-model needs a name and --tracking-uri, but got "
            f"register_model={args.register_model!r}, tracking_uri={tracking.uri!r}"
        )
    return tracking


def main(argv: list[str] | None = None) -> int:
    # The window opens when the command starts (the launcher's start, for its processes).
    started_at = window_opened(time.monotonic())
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    parser, flags = build_parser()
    args = parser.parse_args(raw_argv)
    tracking = run_tracking(args)
    processes = distributed.processes()
    # The other processes train in step with process 0 and keep quiet: one log, one report.
    logging.basicConfig(
        level=logging.INFO if processes.main else logging.WARNING, format="%(message)s"
    )
    given = flags.given(args)
    preset = load_run(args.preset, given)
    spec = preset.spec
    guard = window_guard(args, preset.estimate, started_at)
    # A smoke test of a preset (--max-steps 20) is not the run its estimate predicted: its
    # duration and loss are compared with nothing and do not report back as its trial's.
    departed = _departures(args.preset, spec) if args.preset and given else {}
    predicted = None if departed else predicted_seconds(preset.estimate)
    if args.json:
        check_writable(args.json)
    if spec.gpus > 1 and not processes.several:
        check_gpus(spec.gpus, spec.device, _cuda_devices(spec.device))
        check_start(spec, args.resume)  # bad input stops here, and the data is tokenized once
        return launch(spec.gpus, raw_argv, started_at)
    if args.preset and not args.resume and not processes.several:  # a resume keeps its count
        hint = idle_gpus_hint(spec, _cuda_devices(spec.device), given)
        if hint:
            log.info(hint)
    data_stats = _checked_by_main_first(spec, args.resume, processes)

    from tqdm.contrib.logging import logging_redirect_tqdm

    from trainers.loop.progress import TqdmProgress
    from trainers.loop.run import train

    callbacks: list[Any] = [] if args.quiet or not processes.main else [TqdmProgress(file=sys.stderr)]
    tracker = _tracker(args, tracking, preset, spec, predicted, departed) if processes.main else None
    if tracker is not None:
        callbacks += _tracking_callbacks(tracker, tracking, spec, data_stats)
    failure: str | None = None
    stop = StopOnSignal(once=not processes.several)
    callbacks.append(stop)
    try:
        with logging_redirect_tqdm(), stop:
            # Process 0's window decides; the others stop at the same step (`distributed`).
            window = guard if processes.main else None
            result = train(spec, callbacks, resume=args.resume, window=window)
    except GaveUp as exc:
        if exc.result is None:
            raise
        result, failure = exc.result, str(exc)
    finally:
        if tracker is not None and not tracker.ended:
            tracker.end("FAILED")
    if not processes.main:
        distributed.wait_for_all()  # process 0 writes the report, then every process ends
        return EXIT_FAILED if failure is not None else _exit_code(result)
    try:
        return _report(
            args, raw_argv, preset, spec, result, guard, tracker, predicted, departed, failure
        )
    finally:
        distributed.wait_for_all()


def _departures(preset_path: str, spec: TrainSpec) -> dict[str, list[Any]]:
    """What the flags changed over the preset's own run (`trainers.preset.departures`)."""
    try:
        own = load_run(preset_path, {}).spec
    except BadInputError:  # a preset that only the flags made valid: not the run it predicted
        return {"preset": ["refused without the flags", "made valid by them"]}
    return departures(own, spec)


def _cuda_devices(device: str) -> int:
    if device == "cpu":
        return 0
    import torch

    return torch.cuda.device_count()


def _checked_by_main_first(
    spec: TrainSpec, resume: bool, processes: distributed.Processes
) -> DatasetStats:
    """`check_start`, by process 0 before the others: it tokenizes into the cache they read."""
    if not processes.several:
        return check_start(spec, resume)
    from trainers.loop.run import check_processes

    check_processes(spec, processes)
    distributed.join(spec.device)
    if processes.main:
        stats = check_start(spec, resume)
        distributed.wait_for_all()
        return stats
    distributed.wait_for_all()
    return check_start(spec, resume)


def _exit_code(result: Any) -> int:
    if result.status in ("stopped_by_window", "stopped_by_signal"):
        return EXIT_RESUMABLE
    return EXIT_OK


def _report(
    args: argparse.Namespace,
    raw_argv: list[str],
    preset: Preset,
    spec: TrainSpec,
    result: Any,
    guard: WindowGuard,
    tracker: Any,
    predicted: float | None,
    departed: dict[str, list[Any]],
    failure: str | None,
) -> int:
    """The summary, the JSON report and the MLflow run's end; returns the exit code."""
    result.predicted_seconds = predicted
    band = None if changes_the_loss(departed) else preset.estimate.get("final_val_loss")
    hours = preset.estimate.get("duration_hours")  # shown only with `predicted`, never departed
    for line in summary_lines(
        result, guard, predicted_loss=band, predicted_duration=hours, departed=departed
    ):
        print(line)
    report = run_report(result, preset, spec, departed)
    if tracker is not None:
        _close_tracker(tracker, result, report, preset, spec, args.register_model)
    if args.json:
        write_json(args.json, report)
    if failure is not None:
        print(f"failed: {failure}", file=sys.stderr)
        return EXIT_FAILED
    code = _exit_code(result)
    if code == EXIT_RESUMABLE:
        print("resume with:\n  " + resume_command(raw_argv))
    sys.stdout.flush()
    return code


def _tracking_callbacks(
    tracker: Any, tracking: RunTracking, spec: TrainSpec, data_stats: DatasetStats
) -> list[Any]:
    """The system-metrics monitor (when on) and the tracker; logs the run's data input."""
    callbacks: list[Any] = []
    if tracking.system_metrics_seconds > 0:
        from trainers.system_metrics import SystemMetrics

        # Before the tracker, which closes the run the monitor writes into.
        callbacks.append(
            SystemMetrics(
                tracker.writer,
                tracker.run_id,
                interval_seconds=tracking.system_metrics_seconds,
                resume=tracker.continued,
            )
        )
    callbacks.append(tracker)
    from trainers.data.lineage import dataset_inputs

    for dataset, context in dataset_inputs(
        spec.data, shape=data_stats.shape, rows=data_stats.records,
        validation_split=spec.validation_split, validation_rows=data_stats.validation_records,
        columns=spec.data_columns,
    ):  # fmt: skip
        tracker.writer.log_input(tracker.run_id, dataset, context)
    return callbacks


def _close_tracker(
    tracker: Any,
    result: Any,
    report: dict[str, Any],
    preset: Preset,
    spec: TrainSpec,
    register_as: str | None,
) -> None:
    """Attach the report, log a finished run's adapter, send what waits in the spool."""
    tracker.attach_report(report)
    if result.status == "finished":
        try:
            tracker.log_adapter(result, spec, provenance=preset.provenance, register_as=register_as)
        except Exception as exc:  # the run and its checkpoints stand; say what is missing
            log.warning("the adapter was not logged as an MLflow model: %s", exc)
    tracker.close()  # records the server did not take wait in the output dir's spool


def run_report(
    result: Any, preset: Preset, spec: TrainSpec, departed: dict[str, list[Any]] | None = None
) -> dict[str, Any]:
    """What the run measured, beside its settings and the preset's estimate and provenance.

    `spec` is what the run ran with (flags and full-run defaults applied); `departed`, what
    the flags changed over the preset's own run (`trainers.preset.departures`): a run that
    changed what its loss depends on is not the full run the estimate predicted.

    `python -m analysis.calibrate --full-run FILE` (and the next study, through the run's
    MLflow artifact `result.json`) compares the measured final validation loss and step
    times with what the study predicted, and refits its corrections from them.
    """
    return {
        **result.to_dict(),
        "spec": spec.to_dict(),
        "estimate": dict(preset.estimate),
        "provenance": dict(preset.provenance),
        "preset_departures": dict(departed or {}),
    }


def _tracker(
    args: argparse.Namespace,
    tracking: RunTracking,
    preset: Preset,
    spec: TrainSpec,
    predicted: float | None,
    departed: dict[str, list[Any]],
) -> Any:
    """The MLflow run of this training, or None when tracking is off."""
    uri = tracking.uri
    if not uri or uri == "off":
        return None
    from trainers.tracking import MlflowRun

    provenance = preset.provenance
    tags = {"hpo.role": "full_training"}
    for key, tag in _PROVENANCE_TAGS.items():
        if provenance.get(key) is not None:
            tags[tag] = str(provenance[key])
    if changed := changes_the_loss(departed):  # the study does not take it for its trial's
        tags[DEPARTS_TAG] = ",".join(changed)
    params = {k: v for k, v in spec.to_dict().items() if k not in ("lora", "recovery")}
    params.update({f"lora_{k}": v for k, v in spec.to_dict()["lora"].items()})
    params["effective_batch_size"] = spec.effective_batch_size
    # A resumed training continues its MLflow run: one run, one curve, in the UI.
    run_file = Path(spec.output_dir) / MLFLOW_RUN_FILE
    earlier = _earlier_run_id(run_file) if args.resume else None
    tracker = MlflowRun(
        uri,
        experiment_name=tracking.experiment_name or "hpo-lora",
        run_name=f"full-{provenance.get('study', 'run')}",
        params=params,
        tags=tags,
        parent_run_id=provenance.get("mlflow_parent_run_id"),
        predicted_seconds=predicted,
        continue_run_id=earlier,
        run_id_file=run_file,
        spool_dir=Path(spec.output_dir) / SPOOL_DIR,
    )
    if earlier and not tracker.continued:
        log.warning("MLflow run %s is not in this tracking store: starting a new run", earlier)
    return tracker


def _earlier_run_id(path: Path) -> str | None:
    """The MLflow run id an earlier attempt of this training recorded, if any."""
    try:
        run_id = json.loads(path.read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) and run_id else None


if __name__ == "__main__":
    sys.exit(report_exit(run_cli(main)))
