"""Export the best complete trial of a study as a preset file.

`python -m hpo.export --study-name NAME --storage URL --out FILE`
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import yaml

from analysis.calibration.file import load_for
from analysis.curves.correction import LossCorrection
from analysis.curves.extrapolate import CurveFit
from analysis.studies import load_study
from common.cli import EXIT_OK, check_writable, run_cli
from common.errors import BadInputError
from common.files import write_atomic
from common.flags import study_parser
from common.workdir import WorkDir
from hpo.final_loss import (
    MAX_END_REFITS,
    StudyPrediction,
    correction_summary,
    curve_run_ids,
    loss_band,
    study_prediction,
)
from hpo.keys import (
    CONFIG_ATTR,
    DATA_ATTR,
    ESTIMATE_ATTR,
    FIT_ATTR,
    MLFLOW_RUN_ATTR,
    MODEL_ATTR,
    PARENT_ATTR,
)
from hpo.pick import (
    comparable_order,
    measured_standing,
    pick_trial,
    standing_trials,
)
from hpo.states import FINISHED_STATES
from hpo.storage import make_storage, redact
from hpo.trial_runs import full_run, stored_config
from trainers.preset import launch_command, preset_dict
from trainers.spec import TrainSpec

if TYPE_CHECKING:
    from hpo.tracking import Tracker

PARAM_KEYS = (
    "profile",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "gradient_checkpointing",
    "learning_rate",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
)


def exported_full_run(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> TrainSpec:
    """The full training the trial's configuration becomes (all epochs, `hpo.trial_runs`).

    `preset_dict` adds the full run's recovery, early stopping and checkpoint cadence where
    this sets none, with the defaults `trainers.train` runs with.
    """
    attrs = trial.user_attrs
    missing = [k for k in PARAM_KEYS if k not in attrs]
    if missing or MODEL_ATTR not in study.user_attrs:
        raise BadInputError(
            f"trial {trial.number} of '{study.study_name}' was not recorded by hpo.study "
            f"(missing {', '.join(missing) or MODEL_ATTR})"
        )
    return full_run(
        stored_config(study.user_attrs.get(CONFIG_ATTR) or {}),
        attrs,
        model=study.user_attrs[MODEL_ATTR],
        data=study.user_attrs[DATA_ATTR],
    )


def export_estimate(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    *,
    correction: LossCorrection | None = None,
    refit: StudyPrediction | None = None,
) -> dict[str, Any]:
    """The preset's `estimate`: the time model's prediction when the study had one.

    Args:
        study: The study.
        trial: The exported trial.
        correction: The loss correction as it stands now (full runs may have reported back
            since the trial ran); default: the one the trial was scored with. Given, the
            final loss is predicted again with every curve the study holds now
            (`hpo.final_loss.study_prediction`): the trials after this one, the reference
            run and full runs that reported back join its fit.
        refit: That refit, made already with `correction` (`end_predictions`).
    """
    config: dict[str, Any] = study.user_attrs.get(CONFIG_ATTR) or {}
    budget = config.get("budget") or {}
    attrs = trial.user_attrs
    estimate = dict(attrs.get(ESTIMATE_ATTR) or {})
    if not estimate:
        seconds = float(attrs.get("naive_full_run_seconds", 0.0))
        window_s = float(budget.get("window_hours", 12.0)) * 3600
        margin_s = float(budget.get("safety_margin_minutes", 30.0)) * 60
        estimate = {
            "method": "naive: full-run optimizer steps x measured median step time",
            "duration_hours": {"p50": seconds / 3600},
            "tokens_per_second": float(attrs.get("tokens_per_second", 0.0)),
            "fits_window": seconds <= window_s - margin_s,
            "cost": seconds / 3600 * float(budget.get("price_per_hour", 0.0)),
        }
    estimate.setdefault("window_hours", float(budget.get("window_hours", 12.0)))
    estimate.setdefault("safety_margin_minutes", float(budget.get("safety_margin_minutes", 30.0)))
    estimate.setdefault("full_run_steps", int(attrs.get("full_run_steps", 0)))
    ran = measured_standing(study, [trial]).get(trial.number)
    if ran is not None:  # its configuration's full run reported back: what it measured
        estimate["final_val_loss_measured"] = {"loss": ran.loss, "run_id": ran.run_id}
        if ran.best_step is not None:  # stopped early: its best evaluation, its kept checkpoint
            estimate["final_val_loss_measured"]["best_step"] = ran.best_step
    fit = attrs.get(FIT_ATTR)
    if correction is not None and isinstance(fit, dict):
        refit = refit or _refit(study, trial, correction)
        if refit is not None:  # the whole study's curves, not only the trials before it
            estimate.update(refit.estimate())  # its loss correction the one it applied
        else:
            estimate["final_val_loss"] = loss_band(correction.apply(CurveFit.from_dict(fit)))
            estimate["loss_correction"] = correction_summary(
                correction, len(curve_run_ids(study.user_attrs))
            )
    return estimate


def _refit(
    study: optuna.Study, trial: optuna.trial.FrozenTrial, correction: LossCorrection
) -> StudyPrediction | None:
    """`trial`'s final loss predicted again with every curve `study` holds now."""
    finished = study.get_trials(deepcopy=False, states=FINISHED_STATES)
    study_attrs = study.user_attrs
    return _refit_with(trial, finished, study_attrs, correction, _full_run_epochs(study_attrs))


def _refit_with(
    trial: optuna.trial.FrozenTrial,
    finished: Sequence[optuna.trial.FrozenTrial],
    study_attrs: dict[str, Any],
    correction: LossCorrection,
    epochs: float | None,
) -> StudyPrediction | None:
    others = (t.user_attrs for t in finished if t.number != trial.number)
    return study_prediction(
        trial.user_attrs, others, study_attrs, correction=correction, full_run_epochs=epochs
    )


def _full_run_epochs(study_attrs: dict[str, Any]) -> float | None:
    """The stored config's full-run epochs; None where this version refuses a stored value
    (no one-epoch ceiling then)."""
    try:
        return stored_config(study_attrs.get(CONFIG_ATTR) or {}).full_run.epochs
    except BadInputError:
        return None


def end_predictions(study: optuna.Study) -> dict[int, StudyPrediction]:
    """The standing trials' final losses predicted again with every curve the study holds
    now, by trial number, for the `MAX_END_REFITS` best by score (ranked by what they
    measured where the study scored some by their prediction: `comparable_order`).

    Each trial recorded its prediction when it ended, fitted only with the trials before
    it (the first has no peer and falls back); `--pick cheapest-within` and the report's
    loss-and-hours front compare levels, so they compare these (`rank_fidelity.py`: the
    refit ranks the full runs with Spearman 0.33-1.00 against 0.21-0.90 for the recorded
    p50s). The loss correction is the one the study's calibration file holds now.
    """
    finished = study.get_trials(deepcopy=False, states=FINISHED_STATES)
    standing = comparable_order(standing_trials(study))
    study_attrs = study.user_attrs  # one read of the storage and the calibration per study
    epochs = _full_run_epochs(study_attrs)
    corrections: dict[object, LossCorrection] = {}
    out: dict[int, StudyPrediction] = {}
    for trial in standing[:MAX_END_REFITS]:
        key = _fingerprint(trial)
        if key not in corrections:
            corrections[key] = _correction(study_attrs, key) or LossCorrection()
        refit = _refit_with(trial, finished, study_attrs, corrections[key], epochs)
        if refit is not None:
            out[trial.number] = refit
    return out


def current_correction(
    study: optuna.Study, trial: optuna.trial.FrozenTrial
) -> LossCorrection | None:
    """The loss correction in the study's calibration file now, for the trial's fingerprint."""
    return _correction(study.user_attrs, _fingerprint(trial))


def _fingerprint(trial: optuna.trial.FrozenTrial) -> object:
    return (trial.user_attrs.get(ESTIMATE_ATTR) or {}).get("hardware_fingerprint")


def _correction(study_attrs: dict[str, Any], key: object) -> LossCorrection | None:
    config: dict[str, Any] = study_attrs.get(CONFIG_ATTR) or {}
    work_dir = config.get("work_dir")
    if not key or not work_dir:
        return None
    try:
        calibration, _ = load_for(WorkDir(work_dir).calibration, str(key))
    except BadInputError:
        return None
    return calibration.loss_correction_without(curve_run_ids(study_attrs)) if calibration else None


def build_preset(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    *,
    storage_url: str,
    refit: StudyPrediction | None = None,
) -> dict[str, Any]:

    provenance = {
        "study": study.study_name,
        "trial": trial.number,
        "value": trial.values[0] if trial.values else None,
        "profile": trial.user_attrs.get("profile"),
        # The sampled rate at the space's reference batch; `training.learning_rate` is the
        # rate scaled to this configuration's effective batch.
        "base_learning_rate": trial.user_attrs.get("base_learning_rate"),
        "learning_rate_scaling": trial.user_attrs.get("learning_rate_scaling"),
        "mlflow_parent_run_id": study.user_attrs.get(PARENT_ATTR),
        "mlflow_run_id": trial.user_attrs.get(MLFLOW_RUN_ATTR),
        "storage": redact(storage_url),
        "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    work_dir = (study.user_attrs.get(CONFIG_ATTR) or {}).get("work_dir")
    if work_dir:  # the full run trains under it (trainers.train.default_output_dir)
        provenance["work_dir"] = str(Path(work_dir).resolve())
    return preset_dict(
        exported_full_run(study, trial),
        estimate=export_estimate(
            study, trial, correction=current_correction(study, trial), refit=refit
        ),
        provenance=provenance,
    )


def write_preset(preset: dict[str, Any], out: str | Path) -> Path:
    """Write `preset` to `out` with its launch command (in `launch` and the header)."""
    path = Path(out)
    command = launch_command(path)
    launch = {"command": command, **(preset.get("launch") or {})}
    preset = {**preset, "launch": launch}
    header = f"# hpo preset: run it with  {command}\n"
    if int(launch.get("gpus") or 1) > 1:
        header += f"# it {launch['runs']}\n"
    write_atomic(path, header + yaml.safe_dump(preset, sort_keys=False))
    return path


def export_study(
    study: optuna.Study,
    out: str | Path,
    *,
    storage_url: str,
    trial: optuna.trial.FrozenTrial | None = None,
    picked_by: str | None = None,
    tracking_uri: str | None = None,
    tracker: Tracker | None = None,
    refit: StudyPrediction | None = None,
) -> Path:
    """Write the preset of `trial` (default: the best) and attach it to the parent run.

    `tracking_uri`: the store to attach it in; default the study's, which is stored with its
    password hidden (a password-protected server then needs MLFLOW_TRACKING_PASSWORD).
    `tracker`: the running study's own (its writer spools while the server is away).
    `refit`: `trial`'s end refit, when the caller made it already (`end_predictions`).
    """
    if trial is None:
        trial, picked_by = pick_trial(study)
    preset = build_preset(study, trial, storage_url=storage_url, refit=refit)
    preset["provenance"]["picked_by"] = picked_by or "chosen by the caller"
    path = write_preset(preset, out)
    _attach(study, path, tracking_uri, tracker)
    return path


def _attach(
    study: optuna.Study, path: Path, tracking_uri: str | None, tracker: Tracker | None = None
) -> None:
    from hpo.tracking import Tracker

    config: dict[str, Any] = study.user_attrs.get(CONFIG_ATTR) or {}
    parent = study.user_attrs.get(PARENT_ATTR)
    tracking_uri = tracking_uri or config.get("tracking_uri")
    if not parent or not tracking_uri:
        return
    tracker = tracker or Tracker(tracking_uri, config["experiment_name"])
    tracker.log_artifact(parent, path)


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(
        "python -m hpo.export",
        "Write the best complete trial of a study as a preset YAML file.",
    )
    parser.add_argument("--out", required=True, help="preset file to write")
    parser.add_argument(
        "--format",
        choices=("preset", "trl"),
        default="preset",
        help="preset (default: for python -m trainers.train) | trl: a `trl sft --config` file "
        "(see hpo.export_formats)",
    )
    parser.add_argument("--trial", type=int, help="export this trial instead of the best")
    parser.add_argument(
        "--pick",
        nargs="+",
        metavar="RULE",
        default=["best"],
        help="best (default) | cheapest-within PCT: the cheapest fitting trial whose "
        "predicted loss is within PCT %% of the best",
    )
    args = parser.parse_args(argv)
    within = _within_pct(args.pick)
    check_writable(args.out)
    study = load_study(args.study_name, args.storage, open_storage=make_storage)
    losses = None
    if within is not None or (args.trial is None and measured_standing(study)):
        # Compare levels refitted with the whole study, not as recorded.
        losses = {n: r.final.band()["p50"] for n, r in end_predictions(study).items()}
    trial, rule = pick_trial(study, trial=args.trial, within_pct=within, losses=losses)
    if args.format != "preset":
        from hpo.export_formats import write_format

        preset = build_preset(study, trial, storage_url=args.storage)
        preset["provenance"]["picked_by"] = rule
        config = study.user_attrs.get(CONFIG_ATTR) or {}
        written = write_format(args.format, preset, args.out, tracking=config)
        print(f"{args.format} config of trial {trial.number} ({rule}) written to {written[0]}")
        print(f"run it with: trl sft --config {written[0]}")
        if int(preset["training"].get("gpus") or 1) == 1:  # see the file's header
            print(
                f"  on a node of several GPUs: CUDA_VISIBLE_DEVICES=0 trl sft --config {written[0]}"
            )
        return EXIT_OK
    path = export_study(study, args.out, storage_url=args.storage, trial=trial, picked_by=rule)
    print(f"preset of trial {trial.number} ({rule}) written to {path}")
    print(f"run it with: python -m trainers.train --preset {path}")
    return EXIT_OK


def _within_pct(rule: list[str]) -> float | None:
    """`--pick best` -> None; `--pick cheapest-within PCT` -> PCT."""
    if rule == ["best"]:
        return None
    if len(rule) == 2 and rule[0] == "cheapest-within":
        try:
            return float(rule[1])
        except ValueError:
            pass
    raise BadInputError(
        f"--pick must be 'best' or 'cheapest-within PCT', but got {' '.join(rule)!r}"
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
