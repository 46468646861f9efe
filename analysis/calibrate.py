"""`python -m analysis.calibrate`: fit the time model from a study's trials or from a probe.

    python -m analysis.calibrate --study-name NAME --storage URL [--out FILE]
    python -m analysis.calibrate --probe [--model PATH] [--data FILE] [--out FILE]
    python -m analysis.calibrate --full-run result.json [--full-run ...] [--study-name ...]

From a study, the fit uses the measurements every trained trial recorded (user attribute
`time_model_run`). The probe instead trains a few short runs over a small design of
configurations (micro-batch, accumulation, max_length and rank at two levels each, one
evaluation and one checkpoint per run), within about a minute on a laptop CPU. Either way
the calibration file lands where `python -m hpo.study` looks for it (the work dir's
`calibration.json`) unless `--out` says otherwise.

Full runs report back (`--full-run FILE`, the `--json` file of `python -m trainers.train`,
or every full run of an MLflow experiment with `--tracking-uri`): their final validation
loss against the trial's prediction fits the loss correction, and their step times join
the time fit (`analysis.calibration.full_runs`). A study also reads its experiment's full runs itself
when it starts.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.calibration.file import Calibration, load, load_for
from analysis.calibration.fit import fit
from analysis.calibration.full_runs import FullRun, absorb, from_mlflow, read_report
from analysis.calibration.measurements import RunMeasurements
from analysis.calibration.trial_records import read_trial_record
from analysis.planning.fits import probe_spec
from analysis.studies import load_study
from analysis.study_keys import CONFIG_ATTR, TIME_MODEL_RUN_ATTR
from analysis.timemodel.hardware import HardwareInfo, fingerprint, prior_coefficients
from analysis.timemodel.model import ModelProfile
from common.cli import EXIT_OK, check_writable, run_cli
from common.errors import BadInputError
from common.flags import study_parser
from common.redact import redact
from common.workdir import WorkDir
from trainers.spec import TrainSpec

DEFAULT_WORK_DIR = "hpo-runs"  # hpo.study's default work dir
PROBE_BUDGET_SECONDS = 60.0
PROBE_MICRO_STEPS = 40  # 3 warm-up + 37 steady micro-steps per probe run


@dataclass(frozen=True)
class ProbeConfig:
    """One configuration of the probe design."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    lora_r: int

    @property
    def max_steps(self) -> int:
        """Optimizer steps giving about `PROBE_MICRO_STEPS` micro-steps."""
        return max(1, math.ceil(PROBE_MICRO_STEPS / self.gradient_accumulation_steps))


# A half fraction of the 2^4 factorial (micro-batch 2/8, accumulation 1/2, max_length
# 64/256, rank 4/64; resolution IV): every factor at both levels, with no main effect aliased
# to another or to a two-factor interaction. The ranks bracket the default search space
# (4-64): the adapters' cost is not linear in rank (thin matmuls get more efficient as r
# grows), so predicting rank 64 from probes at 4 and 32 overestimated it (by 8-14 % in
# one round-robin measurement, benchmarks/time_model_shape.py).
# The cheap runs go first, so a slow machine still gets a spread within the time budget.
PROBE_DESIGN: tuple[ProbeConfig, ...] = (
    ProbeConfig(2, 1, 64, 4),
    ProbeConfig(8, 1, 64, 64),
    ProbeConfig(2, 2, 64, 64),
    ProbeConfig(8, 2, 64, 4),
    ProbeConfig(2, 1, 256, 64),
    ProbeConfig(8, 1, 256, 4),
    ProbeConfig(2, 2, 256, 4),
    ProbeConfig(8, 2, 256, 64),
    # Beyond the factorial: the smallest micro-batch (where the fixed per-step cost shows
    # alone), a long sequence (where attention's share grows with its square), both at a
    # middle rank.
    ProbeConfig(1, 1, 128, 32),
    ProbeConfig(4, 1, 512, 32),
)


# ----------------------------------------------------------------------------- from a study


def calibrate_from_study(
    study_name: str, storage: str, *, previous: Path | None = None
) -> tuple[Calibration, str | None]:
    """Fit from the trials a study recorded.

    Args:
        study_name: The Optuna study.
        storage: Its storage URL.
        previous: A calibration file whose prior is reused when its fingerprint matches.

    Returns:
        The calibration and the study's work dir (None when the study does not record one).

    Raises:
        BadInputError: No such study, or no trial with measurements.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(study_name, storage)
    groups: dict[str, list[tuple[HardwareInfo, ModelProfile, RunMeasurements]]] = {}
    for trial in study.get_trials(deepcopy=False):
        record = trial.user_attrs.get(TIME_MODEL_RUN_ATTR)
        if not isinstance(record, Mapping):
            continue
        try:
            hardware, model, run = read_trial_record(record)
        except (KeyError, TypeError) as exc:
            raise BadInputError(
                f"trial {trial.number} of '{study_name}': malformed {TIME_MODEL_RUN_ATTR}: {exc!r}"
            ) from exc
        groups.setdefault(fingerprint(hardware, model), []).append((hardware, model, run))
    if not groups:
        raise BadInputError(
            f"study '{study_name}' has no trained trial with time-model measurements "
            f"(user attribute '{TIME_MODEL_RUN_ATTR}')"
        )
    # Trials from several machines or models: the largest group is the one worth fitting.
    key = max(groups, key=lambda k: len(groups[k]))
    hardware, model, _ = groups[key][0]
    config = study.user_attrs.get(CONFIG_ATTR)
    work_dir = config.get("work_dir") if isinstance(config, Mapping) else None
    existing = load_for(previous, key)[0] if previous is not None else None
    calibration = fit(
        [run for _, _, run in groups[key]],
        model,
        hardware,
        prior=existing.prior if existing else prior_coefficients(hardware),
        # Full runs' losses are not in the study: keep those the file already holds.
        loss_runs=existing.loss_runs if existing else (),
    )
    return calibration, str(work_dir) if work_dir else None


# ----------------------------------------------------------------------------- the probe


def run_probes(
    model_path: str,
    data_path: str,
    design: Sequence[ProbeConfig] = PROBE_DESIGN,
    *,
    work_dir: str | Path,
    eval_samples: int = 16,
    budget_seconds: float = PROBE_BUDGET_SECONDS,
    device: str = "auto",
    precision: str = "auto",
) -> list[dict[str, Any]]:
    """Train each design point briefly (one evaluation, one checkpoint) and measure it.

    Stops starting new runs once `budget_seconds` have passed (at least three always run).

    Returns:
        One trainer result dict per run, with `eval_samples` added.
    """
    from trainers.loop.run import train

    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    work = Path(work_dir)
    for index, point in enumerate(design):
        if index >= 3 and time.perf_counter() - started > budget_seconds * 0.75:
            break  # the next run would likely overrun the budget
        spec = probe_spec(
            point,
            model=model_path,
            data=data_path,
            work_dir=work,
            name=f"probe-{index}",
            max_steps=point.max_steps,
            eval_interval=point.max_steps,  # one evaluation and one save, at the end
            checkpoint_interval=point.max_steps,
            eval_samples=eval_samples,
            device=device,
            precision=precision,
        )
        result = train(spec).to_dict()
        result["eval_samples"] = min(eval_samples, _validation_samples(result, spec))
        results.append(result)
    return results


def _validation_samples(result: Mapping[str, Any], spec: TrainSpec) -> int:
    from trainers.data.dataset import split_indices

    count = int((result.get("dataset") or {}).get("samples", 0))
    if count < 2:
        return 0
    return len(split_indices(count, spec.validation_fraction, spec.seed)[1])


def calibrate_from_results(
    results: Iterable[Mapping[str, Any]], hardware: HardwareInfo
) -> Calibration:
    """Fit from trainer result dicts of one model on `hardware`."""
    from analysis.timemodel.machine import profile_from_result

    results = list(results)
    if not results:
        raise BadInputError("no measured runs to calibrate from")
    model = profile_from_result(results[0])
    runs = [RunMeasurements.from_result_dict(r) for r in results]
    return fit(runs, model, hardware, prior=prior_coefficients(hardware))


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(
        "python -m analysis.calibrate",
        "Fit the time model from a study's trials, or from a short probe.",
        required=False,
    )
    parser.add_argument(
        "--probe", action="store_true", help="train a short probe design instead (about 1 min)"
    )
    parser.add_argument("--model", help="probe: local model folder (default: the tiny model)")
    parser.add_argument("--data", help="probe: JSONL data (default: the bundled demo data)")
    parser.add_argument("--device", default="auto", help="probe: auto | cpu | cuda | mps")
    parser.add_argument("--precision", default="auto", help="probe: auto | fp32 | bf16 | fp16")
    parser.add_argument(
        "--work-dir",
        help=f"where the calibration goes (default: the study's work dir, else {DEFAULT_WORK_DIR})",
    )
    parser.add_argument("--out", help="calibration file (default: WORK_DIR/calibration.json)")
    parser.add_argument(
        "--full-run",
        action="append",
        default=[],
        metavar="FILE",
        help="a full run's report (trainers.train --json); repeatable",
    )
    parser.add_argument(
        "--tracking-uri", help="also read every full run's report from this MLflow store"
    )
    parser.add_argument(
        "--experiment-name", default="hpo-lora", help="the MLflow experiment of --tracking-uri"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    full_runs = [read_report(path) for path in args.full_run]
    if args.probe and args.study_name:
        raise BadInputError("give either --study-name (with --storage) or --probe")
    if not (args.probe or args.study_name or full_runs or args.tracking_uri):
        raise BadInputError(
            "give --study-name (with --storage), --probe, --full-run FILE or --tracking-uri"
        )
    if args.study_name and not args.storage:
        raise BadInputError("--study-name needs --storage (the study's Optuna storage URL)")
    if args.out:
        check_writable(args.out)

    if args.probe:
        out = _calibration_path(args)
        calibration, seconds = _probe(args)
        how = f"{calibration.n_measurements['runs']} probe runs in {seconds:.0f} s"
    elif not args.study_name:
        out = _calibration_path(args)
        if not out.is_file():
            raise BadInputError(
                f"no calibration at {out} to add full runs to: calibrate from the study "
                "(--study-name, --storage) or point --out/--work-dir at its calibration.json"
            )
        calibration, how = load(out), "the calibration file"
    else:
        guess = _calibration_path(args)
        calibration, work_dir = calibrate_from_study(args.study_name, args.storage, previous=guess)
        out = _calibration_path(args, work_dir)
        how = f"{calibration.n_measurements['runs']} trials of study '{args.study_name}'"
    if args.tracking_uri:
        full_runs += _mlflow_full_runs(args.tracking_uri, args.experiment_name)
    if full_runs:
        calibration, losses, timed = absorb(calibration, full_runs)
        how += f" and {len(full_runs)} full runs ({losses} final losses, {timed} timed)"
    calibration.save(out)
    for line in summary_lines(calibration):
        print(line)
    print(f"fitted from {how}; written to {out}")
    return EXIT_OK


def _calibration_path(args: argparse.Namespace, study_work_dir: str | None = None) -> Path:
    """--out, else the calibration file of --work-dir, of the study's work dir, or the default."""
    if args.out:
        return Path(args.out)
    return WorkDir(args.work_dir or study_work_dir or DEFAULT_WORK_DIR).calibration


def _mlflow_full_runs(tracking_uri: str, experiment_name: str) -> list[FullRun]:
    """Every reported full run of the experiment (exit 2 when the store cannot be read)."""
    from mlflow import MlflowClient

    try:
        client = MlflowClient(tracking_uri)
        experiment = client.get_experiment_by_name(experiment_name)
    except Exception as exc:
        raise BadInputError(
            f"cannot read MLflow at {redact(tracking_uri)}: {redact(str(exc))}"
        ) from None
    if experiment is None:
        raise BadInputError(f"no MLflow experiment '{experiment_name}' at {redact(tracking_uri)}")
    return from_mlflow(client, experiment.experiment_id)


def _probe(args: argparse.Namespace) -> tuple[Calibration, float]:
    from analysis.timemodel.machine import this_machine
    from trainers.data.paths import demo_data_path
    from trainers.tiny import default_tiny_model

    hardware = this_machine(args.device, args.precision)
    model = args.model or str(default_tiny_model())
    data = args.data or str(demo_data_path("prompt_completion"))
    for name, path in (("model", model), ("data", data)):
        if not Path(path).exists():
            raise BadInputError(f"{name}: path not found: {path}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hpo-probe-") as work:
        results = run_probes(
            model, data, work_dir=work, device=args.device, precision=args.precision
        )
    return calibrate_from_results(results, hardware), time.perf_counter() - started


def summary_lines(calibration: Calibration) -> list[str]:
    """A few human-readable lines about a calibration."""
    c = calibration.coefficients
    band = math.exp(c.systematic_log_p90)
    counts = calibration.n_measurements
    loss = calibration.loss_correction
    accuracy = (
        f"  final loss: x{loss.scale:.3f} on predictions (spread {loss.log_sd:.1%}), "
        f"from {loss.n_runs} full runs"
        if loss.n_runs
        else "  final loss: no full run reported yet (predictions uncorrected)"
    )
    return [
        f"calibration {calibration.calibration_id} for {calibration.hardware.device_kind} "
        f"'{calibration.hardware.device_name}' (fingerprint {calibration.fingerprint})",
        f"  measured: {counts.get('runs', 0)} runs, {counts.get('micro_step', 0)} micro-steps, "
        f"{counts.get('eval', 0)} evaluations, {counts.get('checkpoint', 0)} checkpoints",
        f"  micro-step: {1e3 * c.micro_fixed_seconds:.1f} ms + "
        f"{1 / c.micro_seconds_per_flop / 1e9:.2f} GFLOP/s effective; "
        f"interval p10-p90 about x{1 / band:.2f} to x{band:.2f} of the median"
        f" (machine drift alone x{math.exp(c.drift_log_p90):.2f}); "
        f"peak memory p90 = median x{math.exp(c.memory_log_p90):.2f}",
        accuracy,
    ]


if __name__ == "__main__":
    sys.exit(run_cli(main))
