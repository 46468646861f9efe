"""A trial's curve on its full run's schedule -> its full run's final loss, with its peers."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import statistics
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.storages.journal import JournalFileBackend

from analysis.curves.correction import LossCorrection
from analysis.curves.extrapolate import CurveFit
from analysis.curves.law import JointFit
from analysis.curves.law_prediction import LawPrediction
from analysis.curves.lr_schedule import learning_rates, schedule_areas
from hpo.final_loss import (
    COLD_FIT_EVERY,
    MAX_SHAPE_CURVES,
    REFERENCE_KEY,
    StoredFit,
    TrialCurve,
    add_shape_curves,
    curve_points,
    curve_run_ids,
    furthest,
    goes_on_from,
    one_pass_ceiling,
    other_configurations,
    peer_curves,
    predict_final_loss,
    shape_curve_attrs,
    shape_curves,
    study_peers,
    study_prediction,
    trial_curve,
)
from hpo.keys import (
    LAW_CURVE_ATTR,
    LAW_FIT_ATTR,
    LEGACY_SHAPE_CURVES_ATTR,
    METHOD_ATTR,
    POINTS_ATTR,
)

SHARED = (1.5, 4.0, 0.7, 2.0, 0.0)
TOTAL = 200
BATCH = 8


def _records(steps: list[int], losses: list[float]) -> list[dict[str, float]]:
    return [
        {"step": s, "loss": loss, "samples_seen": s * BATCH}
        for s, loss in zip(steps, losses, strict=True)
    ]


def _trial(log_tau: float, steps: list[int], seed: int) -> TrialCurve:
    """A trial's evaluations drawn from the law (linear decay over TOTAL steps), with noise."""
    s1, s2 = schedule_areas(learning_rates("linear", TOTAL, 0, 1e-3))
    index = np.asarray(steps) - 1
    law = JointFit(SHARED, (log_tau,), 0.0, 0)
    losses = law.loss(0, s1[index], s2[index]) + np.random.default_rng(seed).normal(
        0, 0.004, len(steps)
    )
    curve = trial_curve(
        _records(steps, list(losses)), scheduler="linear", warmup_ratio=0.0,
        learning_rate=1e-3, full_run_steps=TOTAL,
    )  # fmt: skip
    assert curve is not None
    return curve


def test_a_trial_is_fitted_with_its_peers_and_says_how() -> None:
    steps = [4, 8, 12, 16, 20]
    peers = [_trial(tau, steps, seed) for seed, tau in enumerate([1.5, 2.0, 2.5, 3.0])]
    final = predict_final_loss(
        _trial(2.2, steps, 9), peers=peers, full_run_samples=TOTAL * BATCH,
        correction=LossCorrection(),
    )  # fmt: skip
    assert final.method == "joint" and final.n_points == 5
    assert final.fit.p10 < final.fit.p50 < final.fit.p90
    attrs = final.user_attrs()
    assert attrs[METHOD_ATTR] == "joint" and attrs[POINTS_ATTR] == 5
    # What the study stores is what the export reads back, and what later trials fit with.
    assert CurveFit.from_dict(attrs["curve_fit"]).method == "joint"
    (peer,) = peer_curves([attrs, {"other": 1}, {LAW_CURVE_ATTR: {"steps": "bad"}}])
    assert peer.steps == final.curve.steps
    assert peer.losses == pytest.approx(final.curve.losses, abs=1e-6)
    alone = predict_final_loss(
        _trial(2.2, steps, 9), peers=[], full_run_samples=TOTAL * BATCH,
        correction=LossCorrection(),
    )  # fmt: skip
    assert alone.method == "fallback" and alone.fit.reason


def test_the_correction_scales_the_band_not_the_fit() -> None:
    steps = [4, 8, 12, 16, 20]
    peers = [_trial(tau, steps, seed) for seed, tau in enumerate([1.5, 2.5, 3.0])]
    correction = LossCorrection(scale=0.9, log_sd=0.05, n_runs=3)
    final = predict_final_loss(
        _trial(2.0, steps, 7), peers=peers, full_run_samples=TOTAL * BATCH, correction=correction
    )
    assert final.predicted.p50 == pytest.approx(0.9 * final.fit.p50)
    assert final.predicted.p90 - final.predicted.p10 > 0.9 * (final.fit.p90 - final.fit.p10)


def test_a_prediction_through_an_identified_shape_is_corrected_less() -> None:
    """Once a curve of the study went through a decay (here a whole run of TOTAL steps), a
    full run's ratio is mostly its own configuration's error: the correction is shrunk
    further (`LossCorrection.for_shape`), and the estimate says which one it applied."""
    steps = [4, 8, 12, 16, 20]
    peers = [_trial(tau, steps, seed) for seed, tau in enumerate([1.5, 2.5, 3.0])]
    whole = _trial(2.5, list(range(20, TOTAL + 1, 20)), 5)
    correction = LossCorrection(scale=0.8, log_sd=0.0, n_runs=1)
    target = _trial(2.0, steps, 7)
    shaped = predict_final_loss(
        target, peers=[*peers, whole], full_run_samples=TOTAL * BATCH, correction=correction
    )
    plain = predict_final_loss(
        target, peers=peers, full_run_samples=TOTAL * BATCH, correction=correction
    )
    assert plain.correction == correction
    assert plain.predicted.p50 == pytest.approx(0.8 * plain.fit.p50)
    assert 0.8 < shaped.correction.scale < 1.0
    assert shaped.correction == correction.for_shape(True)
    assert shaped.predicted.p50 == pytest.approx(shaped.correction.scale * shaped.fit.p50)


def test_no_finite_loss_is_no_curve() -> None:
    def curve(records: list[dict[str, float]]) -> TrialCurve | None:
        return trial_curve(
            records, scheduler="linear", warmup_ratio=0.0, learning_rate=1e-3, full_run_steps=10
        )

    assert curve(_records([1, 2], [float("nan"), 2.0])) is None
    assert curve([]) is None


def test_one_point_per_step_and_per_amount_of_data() -> None:
    records = _records([1, 2, 2], [3.0, 2.5, 2.4])
    curve = trial_curve(
        records, scheduler="linear", warmup_ratio=0.0, learning_rate=1e-3, full_run_steps=10
    )
    assert curve is not None and curve.steps == (1, 2) and curve.losses == (3.0, 2.4)
    assert TrialCurve.from_attr(curve.to_attr()) == curve
    assert curve_points(records) == ((8, 3.0), (16, 2.4))


def test_each_fit_starts_from_the_last_trials_and_a_cold_one_comes_back() -> None:
    """The study's fits are warm-started from the last trial's stored fit (same prediction
    as a cold fit on these curves), with a cold fit every COLD_FIT_EVERY-th trial."""
    steps = [4, 8, 12, 16, 20]
    trials = [_trial(tau, steps, seed) for seed, tau in enumerate([1.5, 2.0, 2.5, 3.0, 2.2])]
    stored: list[dict[str, object]] = []  # each trial's user attributes, as Optuna keeps them
    for curve in trials:
        final = predict_final_loss(
            curve, peers=peer_curves(stored), full_run_samples=TOTAL * BATCH,
            correction=LossCorrection(),
        )  # fmt: skip
        stored.append(final.user_attrs())
    warm_counts = [attrs.get(LAW_FIT_ATTR, {}).get("warm") for attrs in stored]  # type: ignore[attr-defined]
    peers = peer_curves(stored)
    # The first trial falls back (no fit stored), the second fits cold, then warm ones.
    assert warm_counts == [None, 0, 1, 2, 3]
    cold = predict_final_loss(
        trials[-1], peers=[dataclasses.replace(p, stored_fit=None) for p in peers[:-1]],
        full_run_samples=TOTAL * BATCH, correction=LossCorrection(),
    )  # fmt: skip
    assert final.fit.p50 == pytest.approx(cold.fit.p50, rel=0.02)
    tired = dataclasses.replace(
        peers[-2], stored_fit=StoredFit((1.5, 4.0, 0.7, 2.0, 0.0), 2.0, COLD_FIT_EVERY - 1)
    )
    again = predict_final_loss(
        trials[-1], peers=[*peers[:-2], tired], full_run_samples=TOTAL * BATCH,
        correction=LossCorrection(),
    )  # fmt: skip
    assert again.stored_fit is not None and again.stored_fit.warm == 0
    assert StoredFit.from_attr({"shared": [1, 2], "log_tau": 0.0, "warm": 0}) is None


def test_the_studys_end_predicts_a_trial_again_with_every_curve() -> None:
    steps = [4, 8, 12, 16, 20]
    taus = [2.2, 1.5, 2.0, 2.5, 3.0]
    recorded = []  # what each trial recorded when it ended: fitted with the trials before it
    for seed, tau in enumerate(taus):
        peers = [TrialCurve.from_attr(a[LAW_CURVE_ATTR]) for a in recorded]
        final = predict_final_loss(
            _trial(tau, steps, seed), peers=[p for p in peers if p is not None],
            full_run_samples=TOTAL * BATCH, correction=LossCorrection(),
        )  # fmt: skip
        recorded.append(final.user_attrs())
    first = CurveFit.from_dict(recorded[0]["curve_fit"])
    assert first.method == "fallback"  # 5 points and no peer when it ended
    s1, s2 = schedule_areas(learning_rates("linear", TOTAL, 0, 1e-3))
    truth = float(JointFit(SHARED, (taus[0],), 0.0, 0).loss(0, s1[-1], s2[-1]))
    correction = LossCorrection(scale=0.9, log_sd=0.05, n_runs=3)
    again = study_prediction(recorded[0], recorded[1:], {}, correction=correction)
    assert again is not None and again.curves == len(taus)
    assert again.final.method == "joint" and again.final.n_points == len(steps)
    # The later trials pin the shared shape down: the refit is nearer the truth.
    assert abs(again.final.fit.p50 / truth - 1) < 0.5 * abs(first.p50 / truth - 1)
    estimate = again.estimate()
    assert estimate["final_val_loss_curves"] == len(taus)
    assert estimate["final_val_loss_method"] == "joint"
    # The preset carries the refit's uncorrected p50: what a full run reports back against.
    assert estimate["final_val_loss"]["p50"] == pytest.approx(
        0.9 * estimate["final_val_loss_uncorrected_p50"], rel=1e-5
    )
    assert study_prediction({"curve_fit": recorded[0]["curve_fit"]}, recorded, {},
                            correction=correction) is None  # fmt: skip


def _first(curve: TrialCurve, points: int) -> TrialCurve:
    """The trial a rung went on from: `curve`'s first `points` evaluations, as stored."""
    stored = TrialCurve.from_attr(curve.to_attr())
    assert stored is not None
    return dataclasses.replace(
        stored, steps=stored.steps[:points], samples=stored.samples[:points],
        losses=stored.losses[:points],
    )  # fmt: skip


def test_each_configuration_is_fitted_once_however_many_rungs_it_went_through() -> None:
    steps = [4, 8, 12, 16, 20, 24]
    a, b, c = (_trial(tau, steps, seed) for seed, tau in enumerate([1.5, 2.0, 2.5]))
    assert goes_on_from(a, _first(a, 2)) and goes_on_from(a, a)
    assert not goes_on_from(_first(a, 2), a) and not goes_on_from(b, _first(a, 2))
    moved = dataclasses.replace(a, full_run_steps=TOTAL * 2)  # another full run's schedule
    assert not goes_on_from(moved, _first(a, 2))
    # The order is kept; of a configuration's curves only the one that went furthest.
    assert furthest([_first(a, 1), b, _first(a, 3), a, _first(c, 2)]) == [b, a, _first(c, 2)]
    # What a rung records: the trial it went on from (rung 0), then itself (rung 1).
    attrs = [
        {LAW_CURVE_ATTR: curve.to_attr()}
        for curve in (_first(a, 1), _first(b, 1), _first(c, 1), _first(a, 3), _first(b, 3))
    ]
    assert [len(p.steps) for p in study_peers(attrs, {})] == [1, 3, 3]
    # The end refit of configuration a's last rung: its own earlier rungs are not its peers.
    target = {**attrs[3], **predict_final_loss(
        _first(a, 3), peers=[], full_run_samples=TOTAL * BATCH, correction=LossCorrection(),
    ).user_attrs()}  # fmt: skip
    again = study_prediction(target, [attrs[0], attrs[1], attrs[2], attrs[4]], {},
                             correction=LossCorrection())  # fmt: skip
    alone = study_prediction(target, [attrs[2], attrs[4]], {}, correction=LossCorrection())
    assert again is not None and alone is not None
    assert again.curves == 3  # a, b and c once each
    assert again.final.band() == alone.final.band()


def test_a_one_epoch_full_run_is_not_predicted_above_the_trials_last_loss() -> None:
    steps = [4, 8, 12, 16, 20]
    peers = [_trial(tau, steps, seed) for seed, tau in enumerate([1.5, 2.0, 2.5, 3.0])]
    target = _trial(2.2, steps, 9)

    def band(epochs: float | None) -> CurveFit:
        return predict_final_loss(
            target, peers=peers, full_run_samples=TOTAL * BATCH, correction=LossCorrection(),
            full_run_epochs=epochs,
        ).fit  # fmt: skip

    free, one, three = band(None), band(1.0), band(3.0)
    last = target.losses[-1]
    # More than one epoch: no ceiling. One: no percentile above where the trial stopped (the
    # law's band on these curves, backtested on them, ends below it: nothing to cap).
    assert three == free and free.p50 < last
    assert one.p90 <= last and one.p50 == free.p50 and one.p10 == free.p10
    # A band that reaches above the last loss is capped there (the law's p50 kept).
    wide = one_pass_ceiling(
        LawPrediction(p10=1.0, p50=2.0, p90=4.0, method="joint", reason="", n_points=5,
                      n_curves=2), last_loss=3.0,
    )  # fmt: skip
    assert (wide.p10, wide.p50, wide.p90) == (1.0, 2.0, 3.0)
    # The last loss is one evaluation and the full run's last another: their noise on top.
    noisy = one_pass_ceiling(
        LawPrediction(p10=1.0, p50=2.0, p90=4.0, method="joint", reason="", n_points=5,
                      n_curves=2, noise=0.05), last_loss=3.0,
    )  # fmt: skip
    assert noisy.p90 == pytest.approx(3.0 + 1.2816 * math.sqrt(2) * 0.05, rel=1e-4)
    # A prediction above the last loss (a curve that stopped improving) keeps its p50.
    law = one_pass_ceiling(
        LawPrediction(p10=1.0, p50=2.0, p90=4.0, method="joint", reason="", n_points=5,
                      n_curves=2), last_loss=1.5,
    )  # fmt: skip
    assert (law.p10, law.p50, law.p90) == (1.0, 2.0, 2.0)


def _shape(rate: float) -> dict[str, object]:
    """A curve through a decay, told apart by its peak rate."""
    return TrialCurve((10, 20), (80, 160), (3.0, 2.5), "linear", 0.0, rate, 20).to_attr()


def test_shape_curves_keep_the_reference_and_the_most_recent_and_read_the_old_attribute() -> None:
    # An older study kept all of them in one attribute; a newer one keeps one per curve.
    attrs: dict[str, object] = {
        LEGACY_SHAPE_CURVES_ATTR: {REFERENCE_KEY: _shape(1e-3), "full_run:old": _shape(2e-3)},
        "unrelated": {"steps": [1]},
    }
    assert [c.learning_rate for c in shape_curves(attrs)] == [1e-3, 2e-3]
    runs = {f"full_run:{i}": _shape(1e-2 + i * 1e-3) for i in range(MAX_SHAPE_CURVES + 1)}
    for i, (source, curve) in enumerate(runs.items()):  # added in reverse: the time decides
        attrs.update(shape_curve_attrs({source: curve}, added_at=1000.0 - i))
    attrs.update(shape_curve_attrs({"full_run:bad": {"steps": "bad"}}, added_at=2000.0))
    kept = [c.learning_rate for c in shape_curves(attrs)]
    # The reference first, then the most recent (the lowest i), the malformed one left out.
    newest = sorted(1e-2 + i * 1e-3 for i in range(MAX_SHAPE_CURVES - 1))[::-1]
    assert kept == pytest.approx([1e-3, *newest])
    # The full runs whose curves fell out (the oldest, the malformed one) correct the study
    # instead: only the kept ones are left out of its correction.
    assert curve_run_ids(attrs) == {str(i) for i in range(MAX_SHAPE_CURVES - 1)}


def _add_curves(path: str, worker: int, count: int, start: object) -> None:
    study = optuna.load_study(
        study_name="s", storage=optuna.storages.JournalStorage(JournalFileBackend(path))
    )
    start.wait()  # type: ignore[attr-defined]
    for i in range(count):
        add_shape_curves(study, {f"full_run:{worker}-{i}": _shape(1e-3 * (1 + i))})


def test_workers_adding_shape_curves_at_once_keep_every_curve(tmp_path: Path) -> None:
    # Two processes add full runs' curves to one journal study at the same moment: before,
    # each read the study's one attribute, merged and wrote it back, and could drop the
    # other's curves.
    path = str(tmp_path / "journal.log")
    storage = optuna.storages.JournalStorage(JournalFileBackend(path))
    optuna.create_study(study_name="s", storage=storage)
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    workers = [context.Process(target=_add_curves, args=(path, w, 15, start)) for w in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
        assert w.exitcode == 0
    held = optuna.load_study(study_name="s", storage=storage).user_attrs
    assert {k for k in held if k.startswith("loss_shape_curve:")} == {
        f"loss_shape_curve:full_run:{w}-{i}" for w in range(2) for i in range(15)
    }


DEMO_P99_CURVES = Path(__file__).parent / "data" / "demo_study_curves_p99.json"


def test_the_demo_studys_pick_is_banded_as_narrowly_as_its_error() -> None:
    """The demo study trains its data's p99 length, and its pick (the last rung, 0.44 of its
    run) is predicted with one other trial that saw part of its decay: recorded at seeds
    0-4 with the full run of each pick. The jackknife left that trial out, the target's own
    partial decay alone then set the annealing term, and the refit's end went below 0: it
    counted as a 100-fold move, and seed 0's band read 0.0105 to 321 around 1.84 (its full
    run 1.63, 11 % off). That trial now stays in every refit, as the only decayed curve
    among the target's peers does."""
    studies = json.loads(DEMO_P99_CURVES.read_text())["studies"]
    lower, errors = [], []
    for study in studies:
        curves = [TrialCurve.from_attr(c) for c in study["curves"]]
        assert all(c is not None for c in curves)
        target = curves[study["pick"]]
        assert target is not None
        others = [c for i, c in enumerate(curves) if i != study["pick"] and c is not None]
        peers = other_configurations(target, furthest(others))
        final = predict_final_loss(
            target, peers=peers, full_run_samples=1.0, correction=LossCorrection()
        )
        actual = study["full_run_final"]
        assert final.fit.p10 <= actual <= final.fit.p90, (study["seed"], final.fit, actual)
        lower.append(math.log(final.fit.p50 / final.fit.p10))
        errors.append(abs(math.log(actual / final.fit.p50)))
    assert len(lower) == 5
    # Each side within a factor e of the p50 (seed 0's was 175-fold), and the median lower
    # side under 3x the median error.
    assert max(lower) < 1.0, lower
    assert statistics.median(lower) < 3 * statistics.median(errors), (lower, errors)
