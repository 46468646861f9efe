"""Does the study's score rank configurations the way their full runs end, and does its
predicted final loss hold?

Configurations are drawn from the default space with the learning rate restricted to its
upper decade (where the hard choices are). Each one runs its full run (1 epoch; its final
validation loss is the verdict) once, and its trial at every `--fractions` share: the first
share of that same full run (same schedule, same data order), evaluated `--trial-evals`
times on the same 200 validation samples. The full runs are shared, only the trials differ.

Per fraction the trials are scored as a study would score them, one after the other: trial
i's prediction (`hpo.final_loss.predict_final_loss`, the schedule-aware law of
`analysis.curves.law` fitted jointly with trials 0..i-1, warm-started from trial i-1's fit,
its band from `analysis.curves.law_prediction`) is what the study records for it.
Reported per fraction: `spearman` of the study's score (the uncorrected p50 where the
prediction is sure enough to rank, else the loss at the trial's fidelity: `hpo.objective`)
against the full runs' final losses, and of the p50 and the loss at fidelity alone, the
pick's rank and regret (and the p50's pick), the median
and p90 absolute error of the uncorrected p50, the share of full runs inside p10-p90, the
median band half-width, the share of fallbacks, `search_seconds` (the trials' total
wall time) and `fit_seconds` (the median time of one trial's prediction); plus the median error with the loss correction fitted leave-one-out from the
other configurations' full runs. With `--promote K` (default 2) and a recorded
`--promote-fraction` (default 0.1), a second table: the study's pick, its end prediction's
error and band, and the search's seconds, without and with the K best trials promoted there
(`promotion`). `--add-fractions` trains recorded configurations' trials at more fractions.
`--full-run-curves EVALS` trains the recorded full runs again with evaluations (their final
loss checked against the record) and adds rows `... end, 1 full run` and `... end, 7 full
runs`: each trial's end prediction once the study's best other full run, or all 7 others,
reported back, their curves among the study's shape curves (`with_full_runs`), and a table of
the picks as the user trains each pick's full run and lets it report back (`until_settled`).

    python benchmarks/rank_fidelity.py [--configs 12] [--pretrain-steps 0] [--data chat]
        [--fractions 0.01,0.02,0.05,0.1] [--samples 3000] [--label-noise 0.3] [--json FILE]
    python benchmarks/rank_fidelity.py --model MODEL --data-file FILE --device cuda --json FILE
    python benchmarks/rank_fidelity.py --rescore FILE   # score recorded runs again
    python benchmarks/rank_fidelity.py --rescore FILE --add-fractions 0.1 --json FILE2
    python benchmarks/rank_fidelity.py --smoke [--json FILE]   # seconds: the suite runs it
    python benchmarks/rank_fidelity.py --rescore FILE --full-run-curves 12 --json FILE2

By default the model is the project's tiny llama (`--pretrain-steps` pre-trains it) and the
data its demo data. `--model` (a model folder or hub name, as `hpo.study --model`) and
`--data-file` (training data as the study reads it: JSONL, Parquet or a saved HF dataset)
measure the same on a real pre-trained model and real data, on `--device`; their full runs
are one epoch of that data, so its size sets the benchmark's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import analysis.curves.lr_schedule  # noqa: E402
from analysis.curves.correction import fit_loss_correction  # noqa: E402
from benchmarks._common import machine, parse_with_smoke, table, write_json  # noqa: E402
from hpo.config import FullRunConfig, StudyConfig, TrialConfig  # noqa: E402
from hpo.prepare import prepare  # noqa: E402
from hpo.reference_run import REFERENCE_AFTER  # noqa: E402
from hpo.trial_runs import full_run, trial_runs  # noqa: E402
from search_spaces import load_space, sample  # noqa: E402
from trainers.spec import DEVICES  # noqa: E402
from trainers.tiny import default_tiny_model  # noqa: E402

if TYPE_CHECKING:
    from hpo.final_loss import TrialCurve

LR_UPPER_DECADE = (5e-4, 5e-3)
FRACTIONS = (0.01, 0.02, 0.05, 0.1)
EVAL_SAMPLES = 200  # the same validation samples for every trial and full run


def draw_configs(n: int, seed: int, space: Any = None) -> list[dict[str, Any]]:
    """`n` unpacked, unquantized configurations from the default space (`space`: the study's,
    its profiles at its training length), learning rate in its upper decade."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space or load_space(None)
    from search_spaces.domains import parse_domain

    # Unpacked only (a packed trial's length counts packed sequences: the study's estimator
    # knows them, this benchmark does not) and unquantized (a CPU has no bitsandbytes).
    domains = {
        **space.domains,
        "learning_rate": _loguniform(*LR_UPPER_DECADE),
        **{key: parse_domain(key, {"choice": ["none"]}) for key in ("packing", "quantization")},
    }
    space = dataclasses.replace(space, domains=domains)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return [sample(study.ask(), space) for _ in range(n)]


def _loguniform(low: float, high: float) -> Any:
    from search_spaces.domains import parse_domain

    return parse_domain("learning_rate", {"loguniform": [low, high]})


def run_config(
    config: StudyConfig,
    params: dict[str, Any],
    prepared: Any,
    work: Path,
    index: int,
    fractions: tuple[float, ...],
) -> dict[str, Any]:
    """The full run of one configuration and its trial at each fraction."""
    from trainers.loop.run import train

    common = {"model": prepared.model_path, "data": prepared.data_path}
    full_spec = full_run(config, params, **common, output_dir=str(work / f"full-{index}"))
    full_spec = dataclasses.replace(full_spec, eval_interval=0, checkpoint_interval=0)
    trials = {
        str(fraction): run_trial(config, params, prepared, work, index, fraction)
        for fraction in fractions
    }
    started = time.perf_counter()
    full = train(full_spec)
    assert full.final_eval_loss is not None
    return {
        "config": index,
        "profile": params["profile"],
        "params": params,
        "effective_batch_size": full_spec.effective_batch_size,
        "learning_rate": params["learning_rate"],
        "scheduler": full_spec.scheduler,
        "warmup_ratio": full_spec.warmup_ratio,
        "full_run_steps": full.final_step,
        "full_run_samples": prepared.train_samples * config.full_run.epochs,
        "full_run_loss": full.final_eval_loss,
        "full_run_seconds": time.perf_counter() - started,
        "trials": trials,
    }


def run_trial(
    config: StudyConfig, params: dict[str, Any], prepared: Any, work: Path, index: int,
    fraction: float,
) -> dict[str, Any]:  # fmt: skip
    """One configuration's trial at `fraction`: the first share of its full run (same
    schedule, same data order), its evaluations and wall time."""
    from trainers.loop.run import train

    spec = trial_runs(
        config, params, model=prepared.model_path, data=prepared.data_path,
        train_samples=prepared.train_samples, fraction=fraction,
        output_dir=str(work / f"trial-{index}-{fraction}"),
    ).trial  # fmt: skip
    started = time.perf_counter()
    result = train(spec)
    return {
        "eval_records": [
            {k: r[k] for k in ("step", "samples_seen", "loss")} for r in result.eval_records
        ],
        "seconds": time.perf_counter() - started,
    }


def _curve(row: dict[str, Any], fraction: str) -> TrialCurve | None:
    from hpo.final_loss import trial_curve

    return trial_curve(
        row["trials"][fraction]["eval_records"],
        scheduler=row["scheduler"],
        warmup_ratio=row["warmup_ratio"],
        learning_rate=row["learning_rate"],
        full_run_steps=row["full_run_steps"],
    )


def run_reference(
    config: StudyConfig, row: dict[str, Any], prepared: Any, work: Path, fraction: float
) -> dict[str, Any]:
    """The study's loss-shape reference run of `row`'s configuration (`hpo.reference_run`)."""
    from hpo.reference_run import reference_curve, reference_spec
    from trainers.loop.run import train

    full_spec = full_run(
        config, row["params"], model=prepared.model_path, data=prepared.data_path,
        output_dir=str(work / f"reference-{row['config']}-{fraction}"),
    )  # fmt: skip
    spec = reference_spec(
        full_spec, row["full_run_steps"], fraction=fraction, evals=2 * config.trial.evals
    )
    started = time.perf_counter()
    result = train(spec)
    curve = reference_curve(spec, result)
    assert curve is not None
    return {"config": row["config"], "fraction": fraction, "curve": curve.to_attr(),
            "seconds": time.perf_counter() - started}  # fmt: skip


def reference_pick(rows: list[dict[str, Any]], fraction: str) -> int:
    """The configuration a study runs its reference with: the best of the first trials."""
    from hpo.reference_run import REFERENCE_AFTER

    first = rows[:REFERENCE_AFTER]
    return int(
        min(first, key=lambda r: r["trials"][fraction]["eval_records"][-1]["loss"])["config"]
    )


def predictions(
    rows: list[dict[str, Any]], fraction: str, reference: dict[str, Any] | None = None,
    *, warm: bool = True, attrs: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """What a study records for each trial, trial i fitted with trials 0..i-1 (and, from
    trial `REFERENCE_AFTER` on, the `reference` run's curve when given: its seconds count
    in the first of those trials' search time). With `warm`, each fit starts from the last
    trial's, as in a study (`hpo.final_loss`); without, every fit starts cold. `attrs`, when
    given, gets each trial's user attributes as the study stores them."""
    from analysis.curves.correction import LossCorrection
    from hpo.final_loss import TrialCurve, predict_final_loss
    from hpo.reference_run import REFERENCE_AFTER

    out: list[dict[str, Any]] = []
    peers: list[TrialCurve] = []
    shape = TrialCurve.from_attr(reference["curve"]) if reference else None
    for index, row in enumerate(rows):
        curve = _curve(row, fraction)
        assert curve is not None
        extra = [shape] if shape is not None and index >= REFERENCE_AFTER else []
        started = time.perf_counter()
        final = predict_final_loss(
            curve, peers=[*peers, *extra], full_run_samples=row["full_run_samples"],
            correction=LossCorrection(), full_run_epochs=1.0,
        )  # fmt: skip
        fit_seconds = time.perf_counter() - started
        peers.append(dataclasses.replace(curve, stored_fit=final.stored_fit if warm else None))
        if attrs is not None:
            attrs.append(final.user_attrs())
        fit = final.fit
        out.append(
            {
                "score": fit.p50 if final.ranks_by_prediction else final.last_loss,
                "p10": fit.p10, "p50": fit.p50, "p90": fit.p90, "method": final.method,
                "n_points": final.n_points, "loss_at_fidelity": final.last_loss,
                "full_run_loss": row["full_run_loss"], "fit_seconds": fit_seconds,
                "seconds": row["trials"][fraction]["seconds"]
                + (reference["seconds"] if reference and index == REFERENCE_AFTER else 0.0),
            }
        )  # fmt: skip
    return out


def end_predictions(
    during: list[dict[str, Any]], attrs: list[dict[str, Any]], reference: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """What the study says of each trial at its end (`hpo.final_loss.study_prediction`, what
    its summary and an exported preset carry): refitted with every other trial's curve and
    the reference run's, not only the trials before it. `during` and `attrs`: what
    `predictions` returned and stored for the same trials (the score, what ranked a trial
    during the search, and its seconds are kept)."""
    from hpo.final_loss import REFERENCE_KEY, shape_curve_attrs

    study_attrs = shape_curve_attrs({REFERENCE_KEY: reference["curve"]}) if reference else {}
    return [_refit(before, attrs, i, study_attrs) for i, before in enumerate(during)]


def _refit(
    before: dict[str, Any], attrs: list[dict[str, Any]], index: int, study_attrs: dict[str, Any]
) -> dict[str, Any]:
    """`before` (trial `index`'s record) with its end prediction, uncorrected: refitted with
    the other trials' `attrs` and the study's shape curves in `study_attrs`."""
    from analysis.curves.correction import LossCorrection
    from hpo.final_loss import study_prediction

    started = time.perf_counter()
    again = study_prediction(
        attrs[index], [*attrs[:index], *attrs[index + 1 :]], study_attrs,
        correction=LossCorrection(), full_run_epochs=1.0,
    )  # fmt: skip
    assert again is not None
    fit = again.final.fit
    return {**before, "p10": fit.p10, "p50": fit.p50, "p90": fit.p90, "method": fit.method,
            "fit_seconds": time.perf_counter() - started}  # fmt: skip


def promotion(
    rows: list[dict[str, Any]], reference: dict[str, Any] | None,
    during: list[dict[str, Any]], attrs: list[dict[str, Any]], ends: list[dict[str, Any]],
    *, promote: int, promote_fraction: float,
) -> dict[str, Any]:  # fmt: skip
    """What the study exports with and without `--promote K`: the `promote` best trials by
    score continued to `promote_fraction` of their full runs (their recorded trial there, the
    same first share of the same full run) and scored again; the pick is the best standing
    trial (`hpo.pick.standing_trials`: a promoted trial replaces its first). For each, the
    pick's rank and regret, its end prediction's |error| and whether its full run lies in
    its band, and the search's seconds (the promoted trials' included)."""
    from analysis.curves.correction import LossCorrection
    from hpo.final_loss import (
        REFERENCE_KEY,
        TrialCurve,
        predict_final_loss,
        shape_curve_attrs,
        study_prediction,
    )
    from hpo.keys import LAW_CURVE_ATTR

    full = np.array([r["full_run_loss"] for r in rows])
    study_attrs = shape_curve_attrs({REFERENCE_KEY: reference["curve"]}) if reference else {}
    first = TrialCurve.from_attr(reference["curve"]) if reference else None
    shape = [first] if first is not None else []
    # The first trials' curves, then each promoted one's as it ends.
    peers = [c for a in attrs if (c := TrialCurve.from_attr(a[LAW_CURVE_ATTR])) is not None]
    chosen = sorted(range(len(during)), key=lambda i: (during[i]["score"], i))[:promote]
    scores = {i: during[i]["score"] for i in range(len(during)) if i not in chosen}
    bands = {i: ends[i] for i in scores}
    searched = sum(p["seconds"] for p in during)
    seconds = searched
    promoted: list[dict[str, Any]] = []
    for i in chosen:  # in the order the study promotes them, each fitted with those before
        curve = _curve(rows[i], str(promote_fraction))
        assert curve is not None
        final = predict_final_loss(
            curve, peers=[*peers, *shape], full_run_samples=rows[i]["full_run_samples"],
            correction=LossCorrection(), full_run_epochs=1.0,
        )  # fmt: skip
        peers.append(curve)
        promoted.append(final.user_attrs())
        scores[i] = final.fit.p50 if final.ranks_by_prediction else final.last_loss
        seconds += rows[i]["trials"][str(promote_fraction)]["seconds"]
    for j, i in enumerate(chosen):
        others = [*attrs, *promoted[:j], *promoted[j + 1 :]]
        again = study_prediction(
            promoted[j], others, study_attrs, correction=LossCorrection(), full_run_epochs=1.0
        )
        assert again is not None
        bands[i] = {k: getattr(again.final.fit, k) for k in ("p10", "p50", "p90")}

    def verdict(pick: int, band: dict[str, Any]) -> dict[str, Any]:
        return {
            "pick_rank": int(np.sum(full < full[pick])) + 1,
            "regret": float(full[pick] - full.min()),
            "pick_abs_pct_error": float(abs(band["p50"] / full[pick] - 1) * 100),
            "pick_in_band": bool(band["p10"] <= full[pick] <= band["p90"]),
            "pick_halfwidth_pct": float((band["p90"] - band["p10"]) / 2 / band["p50"] * 100),
        }

    plain = int(np.argmin([p["score"] for p in during]))
    pick = min(scores, key=lambda i: (scores[i], i))
    return {
        "promote": promote, "promote_fraction": promote_fraction, "promoted": chosen,
        "without": {**verdict(plain, ends[plain]), "search_seconds": searched},
        "with": {**verdict(pick, bands[pick]), "search_seconds": seconds},
    }  # fmt: skip


def score(preds: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank agreement, prediction error, band coverage and regret over one fraction's trials."""
    full = np.array([p["full_run_loss"] for p in preds])
    p50 = np.array([p["p50"] for p in preds])
    p10 = np.array([p["p10"] for p in preds])
    p90 = np.array([p["p90"] for p in preds])
    scores = np.array([p["score"] for p in preds])
    pick = int(np.argmin(scores))
    p50_pick = int(np.argmin(p50))
    error = np.abs(p50 / full - 1) * 100
    corrected = []
    for i in range(len(preds)):  # the correction each trial would get from the other full runs
        others = [(p50[j], full[j]) for j in range(len(preds)) if j != i]
        corrected.append(fit_loss_correction(others).scale * p50[i])
    return {
        "spearman": float(spearmanr(scores, full).statistic),
        "spearman_p50": float(spearmanr(p50, full).statistic),
        "spearman_loss_at_fidelity": float(
            spearmanr([p["loss_at_fidelity"] for p in preds], full).statistic
        ),
        "pick_rank": int(np.sum(full < full[pick])) + 1,
        "pick_rank_p50": int(np.sum(full < full[p50_pick])) + 1,
        "regret": float(full[pick] - full.min()),
        "median_abs_pct_error": float(np.median(error)),
        "p90_abs_pct_error": float(np.percentile(error, 90)),
        "median_abs_pct_error_corrected": float(
            np.median(np.abs(np.array(corrected) / full - 1) * 100)
        ),
        "band_coverage": float(np.mean((p10 <= full) & (full <= p90))),
        "median_band_halfwidth_pct": float(np.median((p90 - p10) / 2 / p50 * 100)),
        "fallback_share": float(np.mean([p["method"] == "fallback" for p in preds])),
        "search_seconds": float(sum(p["seconds"] for p in preds)),
        "fit_seconds": float(np.median([p["fit_seconds"] for p in preds])),
    }


COLUMNS = (
    "spearman", "spearman_p50", "spearman_loss_at_fidelity", "pick_rank", "pick_rank_p50",
    "regret", "median_abs_pct_error",
    "p90_abs_pct_error", "median_abs_pct_error_corrected", "band_coverage",
    "median_band_halfwidth_pct", "fallback_share", "search_seconds", "fit_seconds",
)  # fmt: skip


def report(
    payload: dict[str, Any], *, promote: int = 0, promote_fraction: float = 0.1
) -> dict[str, Any]:
    """Score every fraction of `payload`'s rows; print the table; return the scores. With
    `promote`, also what promoting that many trials to `promote_fraction` (a recorded
    fraction) changes at every smaller fraction (`promotion`, a second table)."""
    rows = payload["rows"]
    scores = {}
    promotions = {}
    repicks: dict[str, dict[str, Any]] = {}
    for fraction in payload["fractions"]:
        key = str(fraction)
        for reference in [None, *payload.get("references", {}).get(key, [])]:
            label = key if reference is None else f"{key} ref {reference['fraction']:g}"
            attrs: list[dict[str, Any]] = []
            preds = predictions(rows, key, reference, attrs=attrs)
            scores[label] = {**score(preds), "predictions": preds}
            ends = end_predictions(preds, attrs, reference)
            scores[f"{label} end"] = {**score(ends), "predictions": ends}
            if all("full_run_curve" in r for r in rows):
                for runs in (1, len(rows) - 1):
                    known = with_full_runs(rows, preds, attrs, reference, runs=runs)
                    scores[f"{label} end, {runs} full run{'s' * (runs > 1)}"] = {
                        **score(known), "predictions": known,
                    }  # fmt: skip
                repicks[label] = until_settled(rows, preds, attrs, reference)
                scores[f"{label} end, 1 full run"]["until_settled"] = repicks[label]
            if (
                promote
                and fraction < promote_fraction
                and str(promote_fraction) in rows[0]["trials"]
            ):
                promotions[f"{label} end"] = promotion(
                    rows, reference, preds, attrs, ends, promote=promote,
                    promote_fraction=promote_fraction,
                )  # fmt: skip
    if payload.get("data_file"):
        data = f"data {payload['data_file']}, {payload['rows'][0]['full_run_samples']:g} samples"
    else:
        data = (
            f"data {payload['data']}, samples {payload.get('samples') or 3000}, "
            f"label noise {payload.get('label_noise', 0.0):g}"
        )
    model = payload.get("model") or f"tiny llama, pretrain_steps {payload['pretrain_steps']}"
    print(
        f"{len(rows)} configurations, {model}, {data}, forward power "
        f"{analysis.curves.lr_schedule.FORWARD_POWER:g}"
    )
    short = ["fraction", "spearman", "sp.p50", "sp.fidelity", "pick", "pick p50", "regret", "med err %", "p90 err %",
             "med err corr %", "coverage", "half-width %", "fallbacks", "search s", "fit s"]  # fmt: skip
    print(table(short, [[k, *(s[c] for c in COLUMNS)] for k, s in scores.items()]))
    if promotions:
        print(f"\nthe pick with and without --promote {promote} to {promote_fraction:g}")
        head = ["fraction", "pick", "regret", "pick err %", "in band", "half-width %",
                "search s", "promoted: pick", "regret", "pick err %", "in band",
                "half-width %", "search s"]  # fmt: skip
        cells = ["pick_rank", "regret", "pick_abs_pct_error", "pick_in_band",
                 "pick_halfwidth_pct", "search_seconds"]  # fmt: skip
        print(table(head, [[k, *(v["without"][c] for c in cells), *(v["with"][c] for c in cells)]
                           for k, v in promotions.items()]))  # fmt: skip
        for label, value in promotions.items():
            scores[label]["promotion"] = value
    if repicks:
        print("\nthe picks as full runs report back (hpo.pick: measured against predicted)")
        head = ["fraction", "picks' ranks", "regret", "full runs", "settled", "last rule"]
        print(table(head, [[k, " -> ".join(str(p["pick_rank"]) for p in v["picks"]),
                            v["picks"][-1]["regret"], v["full_runs"], v["settled"],
                            v["picks"][-1]["rule"]] for k, v in repicks.items()]))  # fmt: skip
    return scores


MAX_FULL_RUNS = 4  # `until_settled`: the most full runs a user trains in its loop


def until_settled(
    rows: list[dict[str, Any]], during: list[dict[str, Any]], attrs: list[dict[str, Any]],
    reference: dict[str, Any] | None, *, max_runs: int = MAX_FULL_RUNS,
) -> dict[str, Any]:  # fmt: skip
    """The user's loop once the study ends: train the pick's full run, let it report back,
    pick again, until the pick is a configuration already trained (or `max_runs` full runs).
    Each pick is `hpo.pick.pick_trial` on a study of these trials (scored as `during`), with
    what the full runs so far measured recorded (`hpo.full_run_reports`) and the others' levels
    their end refits with those runs' curves (`with_full_runs`). Per pick: its rank, regret
    and rule; and how many full runs the loop trained."""
    import optuna

    from hpo.full_run_reports import MeasuredRun, record
    from hpo.keys import PREDICTED_ATTR
    from hpo.pick import pick_trial

    full = np.array([p["full_run_loss"] for p in during])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for before in during:
        band = {k: before[k] for k in ("p10", "p50", "p90")}
        study.add_trial(
            optuna.trial.create_trial(value=before["score"], user_attrs={PREDICTED_ATTR: band})
        )
    pick, rule = pick_trial(study)
    picks = [(pick.number, rule)]
    reported: list[int] = []
    while pick.number not in reported and len(reported) < max_runs:
        reported.append(pick.number)
        record(study, [MeasuredRun(f"run-{pick.number}", pick.number, float(full[pick.number]))])
        known = with_full_runs(rows, during, attrs, reference, reported=reported)
        pick, rule = pick_trial(study, losses={i: p["p50"] for i, p in enumerate(known)})
        picks.append((pick.number, rule))
    return {
        "picks": [
            {"pick_rank": int(np.sum(full < full[n])) + 1, "regret": float(full[n] - full.min()),
             "rule": why}
            for n, why in picks
        ],
        "full_runs": len(reported), "settled": pick.number in reported,
    }  # fmt: skip


@contextlib.contextmanager
def study_setup(
    pretrain_steps: int, data_name: str, samples: int, label_noise: float, trial_evals: int,
    seed: int, *, model: str | None = None, data_file: str | None = None, device: str = "cpu",
) -> Iterator[tuple[StudyConfig, Any, Path]]:  # fmt: skip
    """The benchmark's model, data and study config in a temporary folder (removed after):
    `model` and `data_file` where given, else the tiny llama and the demo data."""
    from trainers.data.paths import demo_data_path

    with tempfile.TemporaryDirectory(prefix="hpo-rank-") as folder:
        work = Path(folder)
        base = model or str(default_tiny_model(pretrain_steps=pretrain_steps))
        data = Path(data_file) if data_file else demo_data_path(data_name)
        if samples or label_noise:  # the same world: more records, or a loss floor
            from trainers.data.make_demo_data import write_demo_data

            write_demo_data(work / "data", samples=samples or 3000, label_noise=label_noise)
            data = work / "data" / data.name
        config = StudyConfig(
            model=base, data=str(data), work_dir=str(work),
            trial=TrialConfig(evals=trial_evals), eval_samples=EVAL_SAMPLES,
            full_run=FullRunConfig(epochs=1.0), device=device, seed=seed,
        )  # fmt: skip
        prepared = prepare(config)
        yield dataclasses.replace(config, eval_max_length=prepared.eval_max_length), prepared, work


def recorded_setup(
    payload: dict[str, Any],
) -> contextlib.AbstractContextManager[tuple[StudyConfig, Any, Path]]:
    """`study_setup` of the runs recorded in `payload` (the same model, data and seed)."""
    return study_setup(
        payload["pretrain_steps"], payload["data"], payload.get("samples") or 0,
        payload.get("label_noise", 0.0), payload["trial_evals"], payload.get("seed", 0),
        model=payload.get("model"), data_file=payload.get("data_file"),
        device=payload.get("device", "cpu"),
    )  # fmt: skip


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Run the full runs and the trials; the payload is written after each configuration."""
    fractions = tuple(float(f) for f in args.fractions.split(","))
    payload: dict[str, Any] = {
        "pretrain_steps": args.pretrain_steps, "samples": args.samples,
        "data": Path(args.data_file).name if args.data_file else args.data,
        "label_noise": args.label_noise, "seed": args.seed, "fractions": fractions,
        "trial_evals": args.trial_evals, "machine": machine(), "rows": [], "references": {},
        "model": args.model, "data_file": args.data_file, "device": args.device,
    }  # fmt: skip
    with study_setup(
        args.pretrain_steps, args.data, args.samples, args.label_noise, args.trial_evals,
        args.seed, model=args.model, data_file=args.data_file, device=args.device,
    ) as (config, prepared, work):  # fmt: skip
        for index, params in enumerate(draw_configs(args.configs, args.seed, prepared.space)):
            row = run_config(config, params, prepared, work, index, fractions)
            payload["rows"].append(row)
            print(
                f"config {index}: batch {row['effective_batch_size']} lr "
                f"{row['learning_rate']:.2g}, {row['full_run_steps']} steps, full run "
                f"{row['full_run_loss']:.3f} in {row['full_run_seconds']:.0f} s",
                flush=True,
            )
            if len(payload["rows"]) == REFERENCE_AFTER:
                payload["references"] = references(
                    config, payload["rows"], prepared, work, fractions, args.reference_fractions
                )
            write_json(args.json, payload)
    return payload


def redo_references(payload: dict[str, Any], reference_fractions: str) -> dict[str, Any]:
    """`payload` with its reference runs made again by the reference run as it is now (the
    full runs and trials are kept: they do not depend on it)."""
    with recorded_setup(payload) as (config, prepared, work):
        fractions = tuple(float(f) for f in payload["fractions"])
        return {
            **payload,
            "references": references(
                config, payload["rows"][:REFERENCE_AFTER], prepared, work, fractions,
                reference_fractions,
            ),
        }  # fmt: skip


def add_fractions(payload: dict[str, Any], fractions: str) -> dict[str, Any]:
    """`payload` with every recorded configuration's trial at more `fractions` (the full
    runs, trials and reference runs recorded are kept: the new trials are the first shares
    of the same full runs, trained as `run_config` trains them)."""
    extra = sorted({float(f) for f in fractions.split(",") if f} - set(payload["fractions"]))
    with recorded_setup(payload) as (config, prepared, work):
        rows = []
        for row in payload["rows"]:
            trials = dict(row["trials"])
            for fraction in extra:
                trials[str(fraction)] = run_trial(
                    config, row["params"], prepared, work, row["config"], fraction
                )
                print(f"config {row['config']}: trial at {fraction:g} in "
                      f"{trials[str(fraction)]['seconds']:.0f} s", flush=True)  # fmt: skip
            rows.append({**row, "trials": trials})
    return {**payload, "rows": rows, "fractions": sorted({*payload["fractions"], *extra})}


def add_full_run_curves(payload: dict[str, Any], evals: int) -> dict[str, Any]:
    """`payload` with every recorded configuration's full run trained again, evaluated
    `evals` times on the way, its curve recorded as a full run reports it back to the study
    (`analysis.calibration.full_runs.FullRun.shape_curve`). The training is the recorded one: its final
    loss is checked against the recorded (an evaluation changes no weight nor data order)."""
    from analysis.calibration.full_runs import FullRun
    from trainers.loop.run import train

    with recorded_setup(payload) as (config, prepared, work):
        rows = []
        for row in payload["rows"]:
            spec = full_run(
                config, row["params"], model=prepared.model_path, data=prepared.data_path,
                output_dir=str(work / f"full-{row['config']}"),
            )  # fmt: skip
            interval = max(1, row["full_run_steps"] // evals)
            spec = dataclasses.replace(spec, eval_interval=interval, checkpoint_interval=0)
            result = train(spec)
            assert result.final_eval_loss is not None and result.final_step == row["full_run_steps"]
            drift = abs(result.final_eval_loss / row["full_run_loss"] - 1)
            if drift > 1e-3:
                raise SystemExit(
                    f"config {row['config']}: the full run ended at {result.final_eval_loss:.5f}"
                    f" trained again, not the recorded {row['full_run_loss']:.5f}"
                )
            schedule = {k: getattr(spec, k) for k in ("scheduler", "warmup_ratio", "learning_rate")}
            curve = FullRun(spec.output_dir, {**result.to_dict(), "spec": schedule}).shape_curve()
            assert curve is not None
            print(f"config {row['config']}: full run again, {len(curve['steps'])} points, final "
                  f"{result.final_eval_loss:.4f} (recorded {row['full_run_loss']:.4f})",
                  flush=True)  # fmt: skip
            rows.append({**row, "full_run_curve": curve})
    return {**payload, "rows": rows}


def with_full_runs(
    rows: list[dict[str, Any]], during: list[dict[str, Any]], attrs: list[dict[str, Any]],
    reference: dict[str, Any] | None, *, runs: int | None = None,
    reported: list[int] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Each trial's end prediction once other configurations' full runs have reported back,
    as a study holds them (`hpo.reference_run.add_full_run_curves`): their whole curves join
    the reference run's as shape curves (never its own full run). `runs`: that many, the
    study's picks first (its best scores), as a user runs them; None: all the others;
    `reported`: these configurations' full runs instead (each trial's own left out). The
    study's loss correction leaves its own full runs out (their curves are in the fit:
    `hpo.final_loss.curve_run_ids`), so these are uncorrected; `score`'s LOO column is the
    correction all other full runs would give on top."""
    from hpo.final_loss import FULL_RUN_SOURCE, REFERENCE_KEY, shape_curve_attrs

    by_score = sorted(range(len(during)), key=lambda j: (during[j]["score"], j))
    out = []
    for i, before in enumerate(during):
        chosen = [j for j in (by_score if reported is None else reported) if j != i]
        chosen = chosen[:runs] if reported is None else chosen
        curves = {f"{FULL_RUN_SOURCE}{j}": rows[j]["full_run_curve"] for j in chosen}
        if reference:
            curves[REFERENCE_KEY] = reference["curve"]
        out.append(_refit(before, attrs, i, shape_curve_attrs(curves, added_at=0.0)))
    return out


def references(
    config: StudyConfig, rows: list[dict[str, Any]], prepared: Any, work: Path,
    fractions: tuple[float, ...], reference_fractions: str,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Per trial fraction, the reference run at each of `reference_fractions` (one run per
    configuration and reference fraction, shared by the trial fractions that pick it)."""
    done: dict[tuple[int, float], dict[str, Any]] = {}
    out: dict[str, list[dict[str, Any]]] = {}
    for fraction in fractions:
        pick = reference_pick(rows, str(fraction))
        for share in (float(f) for f in reference_fractions.split(",") if f):
            if (pick, share) not in done:
                done[pick, share] = run_reference(config, rows[pick], prepared, work, share)
                print(f"reference run: config {pick} to {share:g} in "
                      f"{done[pick, share]['seconds']:.0f} s", flush=True)  # fmt: skip
            out.setdefault(str(fraction), []).append(done[pick, share])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=12, help="configurations (>= 4)")
    parser.add_argument("--pretrain-steps", type=int, default=0, help="0: a fresh tiny model")
    parser.add_argument("--data", default="prompt_completion", help="bundled data set")
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS))
    parser.add_argument("--trial-evals", type=int, default=6)
    parser.add_argument(
        "--samples", type=int, default=0,
        help="generate the demo data with this many records (0: the bundled 3000); more "
        "records make full runs long enough that a few percent is dozens of steps",
    )  # fmt: skip
    parser.add_argument(
        "--label-noise", type=float, default=0.0,
        help="generate the demo data with this share of facts and sums answered at random: "
        "a loss floor, as real fine-tuning data has (0: exact answers)",
    )  # fmt: skip
    parser.add_argument(
        "--reference-fractions", default="0.1,0.2,0.3",
        help="loss-shape reference runs' shares of their full run (empty: none)",
    )  # fmt: skip
    parser.add_argument(
        "--forward-power", type=float, default=None,
        help="score with S1 adding (rate / peak) ** P per step (default: the law's "
        "analysis.curves.lr_schedule.FORWARD_POWER; 1: the paper's area under the rate)",
    )  # fmt: skip
    parser.add_argument(
        "--promote", type=int, default=2,
        help="also score the pick with the K best trials promoted (0: not)",
    )  # fmt: skip
    parser.add_argument(
        "--promote-fraction", type=float, default=0.1,
        help="the share promoted trials train on (a fraction the runs recorded)",
    )  # fmt: skip
    parser.add_argument(
        "--add-fractions", default="",
        help="with --rescore: train every recorded configuration's trial at these fractions "
        "too (the full runs are kept)",
    )  # fmt: skip
    parser.add_argument(
        "--full-run-curves", type=int, default=0, metavar="EVALS",
        help="with --rescore: train every recorded full run again with EVALS evaluations and "
        "score each trial's end prediction with the other full runs' curves as well, as a "
        "study holds them once they report back (0: not)",
    )  # fmt: skip
    parser.add_argument(
        "--model", help="a pre-trained model folder or hub name instead of the tiny llama"
    )
    parser.add_argument(
        "--data-file", help="training data (JSONL, Parquet or a saved HF dataset) instead of "
        "the demo data",
    )  # fmt: skip
    parser.add_argument(
        "--device", default="cpu", choices=DEVICES, help="training device (default: cpu)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--json", help="write the runs and scores here")
    parser.add_argument("--rescore", help="score the runs recorded in this JSON file instead")
    parser.add_argument(
        "--redo-references", action="store_true",
        help="with --rescore: run the reference runs again (as the study runs them now) "
        "before scoring; the full runs and trials are kept",
    )  # fmt: skip
    # The smoke: 200 records train (one epoch, a few dozen steps), 200 validate.
    args = parse_with_smoke(
        parser, argv, "4 configurations on 400 demo records, one fraction",
        configs=4, samples=2 * EVAL_SAMPLES, fractions="0.1", trial_evals=2,
        reference_fractions="0.3", promote=1,
    )  # fmt: skip
    if args.samples < 0 or 0 < args.samples < 2 * EVAL_SAMPLES:
        parser.error(
            f"--samples must be 0 (the bundled data) or at least {2 * EVAL_SAMPLES} "
            f"({EVAL_SAMPLES} are held out for validation), but got {args.samples}"
        )
    if not 0.0 <= args.label_noise <= 1.0:
        parser.error(f"--label-noise must lie in [0, 1], but got {args.label_noise}")
    if args.model and args.pretrain_steps:
        parser.error("--pretrain-steps pre-trains the tiny llama: give it or --model, not both")
    if args.data_file and (args.samples or args.label_noise or args.data != "prompt_completion"):
        parser.error(
            "--samples, --label-noise and --data make the demo data: give them or --data-file, "
            "not both"
        )
    if args.data_file and not Path(args.data_file).exists():
        parser.error(f"--data-file {args.data_file} does not exist")
    if (args.redo_references or args.add_fractions or args.full_run_curves) and not args.rescore:
        parser.error(
            "--redo-references, --add-fractions and --full-run-curves need --rescore FILE "
            "(the recorded runs)"
        )
    if args.full_run_curves < 0:
        parser.error(f"--full-run-curves must be >= 0, but got {args.full_run_curves}")
    if args.promote < 0 or not 0.0 < args.promote_fraction <= 1.0:
        parser.error(
            f"--promote must be >= 0 and --promote-fraction in (0, 1], but got "
            f"{args.promote} and {args.promote_fraction}"
        )
    if args.forward_power is not None:
        if not 0.0 < args.forward_power <= 1.0:
            parser.error(f"--forward-power must lie in (0, 1], but got {args.forward_power}")
        analysis.curves.lr_schedule.FORWARD_POWER = args.forward_power
    trains = args.redo_references or args.add_fractions or args.full_run_curves
    if args.threads and (trains or not args.rescore):
        import torch

        torch.set_num_threads(args.threads)
    if args.rescore:
        payload = json.loads(Path(args.rescore).read_text(encoding="utf-8"))
        if args.redo_references:
            payload = redo_references(payload, args.reference_fractions)
        if args.add_fractions:
            payload = add_fractions(payload, args.add_fractions)
        if args.full_run_curves:
            payload = add_full_run_curves(payload, args.full_run_curves)
    else:
        payload = collect(args)
    scores = report(payload, promote=args.promote, promote_fraction=args.promote_fraction)
    power = analysis.curves.lr_schedule.FORWARD_POWER
    write_json(args.json, {**payload, "forward_power": power, "scores": scores})
    return 0


if __name__ == "__main__":
    sys.exit(main())
