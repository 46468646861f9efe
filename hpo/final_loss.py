"""A trial's validation curve -> the predicted final validation loss of its full run.

The trial is the start of its full run, so its evaluations are the first points of the full
run's curve, on the full run's learning-rate schedule. `analysis.curves.law` places them on
that schedule (the areas S1/S2 of Tissue et al.'s law at each evaluated step and at the full
run's last step) and fits them together with the study's other trials' curves (`peers`),
which share the model and data and so the loss's shape. The study's loss correction, fitted
from full runs that reported back, is then applied as the last layer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from analysis.curves.correction import LossCorrection
from analysis.curves.extrapolate import CurveFit
from analysis.curves.law import CurveData, JointFit, curve_data, warm_start
from analysis.curves.law_prediction import LawPrediction, fit_shared, predict_final
from analysis.curves.lr_schedule import learning_rates, warmup_steps
from analysis.curves.noise import Z90
from hpo.keys import (
    CURVE_ATTR,
    FIT_ATTR,
    LAW_CURVE_ATTR,
    LAW_FIT_ATTR,
    LEGACY_SHAPE_CURVES_ATTR,
    METHOD_ATTR,
    POINTS_ATTR,
    PREDICTED_ATTR,
    SHAPE_CURVE_PREFIX,
)

# The study promises its final loss within p10-p90 of about +-20 %; an extrapolation whose
# own error alone (Z90 x its log sd) is wider does not rank trials: their loss at equal data
# does (rank_fidelity.py: Spearman 0.94-1.0 against 0.43-0.9 for the extrapolation at trial
# fractions 0.01-0.1 on the tiny models).
TRUSTED_LOG_HALF_WIDTH = math.log(1.2)
MAX_PEERS = 24  # the most recent trials a prediction is fitted with (time grows with them)
MAX_END_REFITS = 48  # the best trials the study's end predicts again (hpo.export.end_predictions)
# A shape curve on the study (`hpo.keys.SHAPE_CURVE_PREFIX` + its source) holds
# TrialCurve.to_attr() and when it was added (ADDED_KEY).
ADDED_KEY = "added_at"  # unix seconds: the most recent curves are kept
REFERENCE_KEY = "reference"  # the reference run's source
FULL_RUN_SOURCE = "full_run:"  # + its run id: a full run of this study that reported back
MAX_SHAPE_CURVES = 8  # the reference and the most recent full runs
# A warm-started fit follows the last one; every this many fits one starts cold (two
# starts) so that a drift into a poor optimum does not carry on.
COLD_FIT_EVERY = 8


@dataclass(frozen=True)
class StoredFit:
    """The joint fit a trial was predicted with, as its user attribute keeps it.

    Attributes:
        shared: (L0, D, alpha, beta, C).
        log_tau: The trial's own ln tau.
        warm: Warm-started fits since the last cold one (0: this one was cold).
    """

    shared: tuple[float, ...]
    log_tau: float
    warm: int

    def to_attr(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"shared": [float(f"{v:.9g}") for v in self.shared],
                "log_tau": float(f"{self.log_tau:.9g}"), "warm": self.warm}  # fmt: skip

    @classmethod
    def from_attr(cls, value: object) -> StoredFit | None:
        """Read `to_attr` back; None for anything malformed (the fit then starts cold)."""
        if not isinstance(value, Mapping):
            return None
        try:
            shared = tuple(float(v) for v in value["shared"])
            stored = cls(shared, float(value["log_tau"]), int(value["warm"]))
        except (KeyError, TypeError, ValueError):
            return None
        finite = all(math.isfinite(v) for v in (*shared, stored.log_tau))
        return stored if len(shared) == 5 and finite and stored.warm >= 0 else None


@dataclass(frozen=True)
class TrialCurve:
    """A trial's evaluations and its full run's schedule: all the law needs.

    Attributes:
        steps: Optimizer step of each evaluation (of the full run's schedule).
        samples: Training samples seen at each evaluation.
        losses: Validation loss of each evaluation.
        scheduler: The full run's learning-rate schedule.
        warmup_ratio: Its warm-up share.
        learning_rate: Its peak rate.
        full_run_steps: Its optimizer steps.
        stored_fit: The fit the trial was predicted with (a warm start for later ones).
    """

    steps: tuple[int, ...]
    samples: tuple[int, ...]
    losses: tuple[float, ...]
    scheduler: str
    warmup_ratio: float
    learning_rate: float
    full_run_steps: int
    stored_fit: StoredFit | None = field(default=None, compare=False)

    def data(self) -> CurveData:
        """The points placed on the full run's schedule."""
        total = self.full_run_steps
        rates = learning_rates(
            self.scheduler, total, warmup_steps(total, self.warmup_ratio), self.learning_rate
        )
        return curve_data(self.steps, self.losses, rates)

    def to_attr(self) -> dict[str, Any]:
        """A JSON-ready dict (a trial's user attribute)."""
        return {
            "steps": list(self.steps), "samples": list(self.samples),
            "losses": [round(v, 6) for v in self.losses], "scheduler": self.scheduler,
            "warmup_ratio": self.warmup_ratio, "learning_rate": self.learning_rate,
            "full_run_steps": self.full_run_steps,
        }  # fmt: skip

    @classmethod
    def from_attr(cls, value: object) -> TrialCurve | None:
        """Read `to_attr` back; None for anything malformed (a peer is then left out)."""
        if not isinstance(value, Mapping):
            return None
        try:
            curve = cls(
                steps=tuple(int(v) for v in value["steps"]),
                samples=tuple(int(v) for v in value["samples"]),
                losses=tuple(float(v) for v in value["losses"]),
                scheduler=str(value["scheduler"]),
                warmup_ratio=float(value["warmup_ratio"]),
                learning_rate=float(value["learning_rate"]),
                full_run_steps=int(value["full_run_steps"]),
            )
            curve.data()
        except (KeyError, TypeError, ValueError):
            return None
        return curve


def trial_curve(
    eval_records: Sequence[Mapping[str, Any]],
    *,
    scheduler: str,
    warmup_ratio: float,
    learning_rate: float,
    full_run_steps: int,
) -> TrialCurve | None:
    """A run's evaluations as a `TrialCurve`: one point per step (the last), steps >= 1.

    Returns:
        None when no evaluation has a finite loss at a step of the schedule.
    """
    by_step: dict[int, tuple[int, float]] = {}
    for record in eval_records:
        step = int(record.get("step", 0))
        if 1 <= step <= full_run_steps:
            by_step[step] = (int(record.get("samples_seen", 0)), float(record["loss"]))
    if not by_step or not all(math.isfinite(loss) for _, loss in by_step.values()):
        return None
    steps = sorted(by_step)
    return TrialCurve(
        steps=tuple(steps),
        samples=tuple(by_step[s][0] for s in steps),
        losses=tuple(by_step[s][1] for s in steps),
        scheduler=scheduler,
        warmup_ratio=warmup_ratio,
        learning_rate=learning_rate,
        full_run_steps=full_run_steps,
    )


def peer_curves(user_attrs: Iterable[Mapping[str, Any]]) -> list[TrialCurve]:
    """The curves other trials recorded (the last `MAX_PEERS`), malformed ones left out, and
    each configuration once: a curve a later rung went on from is left out (`furthest`)."""
    curves = [
        (TrialCurve.from_attr(attrs.get(LAW_CURVE_ATTR)), attrs.get(LAW_FIT_ATTR))
        for attrs in user_attrs
    ]
    read = [replace(c, stored_fit=StoredFit.from_attr(fit)) for c, fit in curves if c is not None]
    return furthest(read)[-MAX_PEERS:]


def furthest(curves: Sequence[TrialCurve]) -> list[TrialCurve]:
    """`curves` less those another of them goes on from (in their order; of two equal curves
    the later is kept).

    A rung continues its trial from its checkpoint, and its curve holds the evaluations of
    the trials it went on from (`objective._curve_records`): a configuration promoted twice
    recorded its first points three times. The joint fit then took them as three
    configurations, each with its own speed: the same evaluations weighed three times, the
    jackknife left out one copy and kept the others, and the backtest predicted a rung-2
    curve's points from its own rung-1 copy. On the recorded real LoRA runs the default's
    study holds 12 configurations in 20 curves at its end (docs/curve-replay.md, "Each
    configuration once, and the backtest cross-fitted").
    """
    # Only curves of one schedule and one first point can go on from each other: a study of
    # hundreds of trials compares within those groups, not every pair.
    keys = [(*_schedule(c), c.steps[:1], tuple(round(v, 6) for v in c.losses[:1])) for c in curves]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return [
        c
        for i, c in enumerate(curves)
        if not any(
            goes_on_from(curves[j], c)
            for j in groups[keys[i]]
            if j != i and (j > i or len(curves[j].steps) > len(c.steps))
        )
    ]


def _schedule(curve: TrialCurve) -> tuple[str, float, float, int]:
    return (curve.scheduler, curve.warmup_ratio, curve.learning_rate, curve.full_run_steps)


def other_configurations(curve: TrialCurve, peers: Sequence[TrialCurve]) -> list[TrialCurve]:
    """`peers` less the trials `curve` went on from: its own first points, not another
    configuration's."""
    return [p for p in peers if not goes_on_from(curve, p)]


def goes_on_from(curve: TrialCurve, earlier: TrialCurve) -> bool:
    """Whether `curve` is `earlier` gone on: the same full run's schedule, and `earlier`'s
    evaluations its first ones (losses as a trial stores them, to 6 decimals)."""
    n = len(earlier.steps)
    return (
        n <= len(curve.steps)
        and _schedule(curve) == _schedule(earlier)
        and curve.steps[:n] == earlier.steps
        and all(
            round(a, 6) == round(b, 6)
            for a, b in zip(curve.losses[:n], earlier.losses, strict=True)
        )
    )


def shape_curves(study_attrs: Mapping[str, Any]) -> list[TrialCurve]:
    """The study's curves through a decay: the reference run's, then the most recent others
    (`MAX_SHAPE_CURVES` in all), malformed ones left out."""
    return list(_kept_shape_curves(study_attrs).values())


def curve_run_ids(study_attrs: Mapping[str, Any]) -> frozenset[str]:
    """The run ids of the study's full runs whose curves its fit holds (`shape_curves`): its
    loss correction leaves them out (`Calibration.loss_correction_without`). A full run whose
    curve fell out of the most recent `MAX_SHAPE_CURVES` corrects it instead, as it would a
    run of another study."""
    return frozenset(
        source.removeprefix(FULL_RUN_SOURCE)
        for source in _kept_shape_curves(study_attrs)
        if source.startswith(FULL_RUN_SOURCE)
    )


def _kept_shape_curves(study_attrs: Mapping[str, Any]) -> dict[str, TrialCurve]:
    """`shape_curves` by source, in their order."""
    held: dict[str, tuple[float, Any]] = {}
    legacy = study_attrs.get(LEGACY_SHAPE_CURVES_ATTR)
    if isinstance(legacy, Mapping):  # in the order they were added, before any newer one
        held.update((str(k), (-math.inf, v)) for k, v in legacy.items())
    for key, value in study_attrs.items():
        if key.startswith(SHAPE_CURVE_PREFIX) and isinstance(value, Mapping):
            added = value.get(ADDED_KEY)
            when = float(added) if isinstance(added, (int, float)) else -math.inf
            when = when if math.isfinite(when) else -math.inf
            held[key.removeprefix(SHAPE_CURVE_PREFIX)] = (when, value)
    curves = {
        source: curve
        for source, (_, value) in sorted(held.items(), key=lambda item: item[1][0])
        if (curve := TrialCurve.from_attr(value)) is not None
    }
    reference = curves.pop(REFERENCE_KEY, None)
    others = list(curves.items())[-(MAX_SHAPE_CURVES - (reference is not None)) :]
    return dict([(REFERENCE_KEY, reference), *others] if reference is not None else others)


def shape_curve_attrs(
    curves: Mapping[str, Mapping[str, Any]], added_at: float | None = None
) -> dict[str, dict[str, Any]]:
    """The study attributes that hold `curves` ({source: TrialCurve.to_attr()}), one each,
    stamped `added_at` (default: now)."""
    when = time.time() if added_at is None else added_at
    return {SHAPE_CURVE_PREFIX + source: {**c, ADDED_KEY: when} for source, c in curves.items()}


def add_shape_curves(study: Any, curves: Mapping[str, Mapping[str, Any]]) -> None:
    """Store `curves` ({source: TrialCurve.to_attr()}) with the study's others (an Optuna
    study): one attribute per curve, so that workers adding curves at once keep them all (a
    curve of the same source is replaced)."""
    for key, value in shape_curve_attrs(curves).items():
        study.set_user_attr(key, value)


def study_peers(
    trial_attrs: Iterable[Mapping[str, Any]], study_attrs: Mapping[str, Any]
) -> list[TrialCurve]:
    """What a trial is fitted with: the other trials' curves and the study's shape curves."""
    return furthest([*peer_curves(trial_attrs), *shape_curves(study_attrs)])


def shared_shape(curves: Sequence[TrialCurve]) -> dict[str, Any]:
    """The law's shared exponent and annealing coefficient, fitted to `curves` jointly."""
    distinct = furthest(curves)
    fit, _, _ = fit_shared([c.data() for c in distinct])
    return {"alpha": fit.shared[2], "annealing": fit.shared[4], "curves": len(distinct)}


def trial_score(
    final: FinalLoss, *, objective: str, multi_objective: bool, last_rung: bool
) -> tuple[float, str]:
    """The value a trial reports to Optuna, and what it is (`SCORED_BY_ATTR`).

    A multi-objective study weighs the level against hours: the law's p50. Otherwise the
    loss at equal data ranks (the extrapolation ranked worse on every recorded set, real or
    tiny: benchmarks/curve_replay.py, rank_fidelity.py), unless the study's own backtest
    says its law ranks its curves' later points better (`FinalLoss.ranks_by_prediction`).
    The study's last rung picks among few configurations that went furthest: there the
    loss one doubling on (`loss_one_doubling_on`) ranks them, which favours a curve still
    falling over one that has flattened (a short run favours a high learning rate, which
    flattens first). The p50 is uncorrected: the correction is one factor and changes no
    ranking.
    """
    if objective == "predicted_full_run_loss" and (multi_objective or final.ranks_by_prediction):
        return final.fit.p50, "prediction"
    if last_rung:
        return final.loss_one_doubling_on, "loss_one_doubling_on"
    return final.last_loss, "loss_at_fidelity"


def loss_one_doubling_on(samples: Sequence[float], losses: Sequence[float]) -> float:
    """The last loss plus its drop since half the last point's data (linear between
    evaluations; the first loss where no point lies that early): the loss at twice the data
    if the curve falls as much again, as a straight line in log data would."""
    last = float(losses[-1])
    earlier = float(np.interp(0.5 * float(samples[-1]), samples, losses))
    return last - (earlier - last)


@dataclass(frozen=True)
class FinalLoss:
    """A trial's curve and what it predicts for the end of its full run.

    Attributes:
        curve: The trial's evaluations on its schedule.
        fit: The prediction before the correction (a CurveFit: the report and the export
            read it), its method "joint", "own" or "fallback".
        predicted: The prediction the study uses: `fit` with `correction` applied.
        extrapolation_log_sd: The law's extrapolation error (log sd) at this trial's
            distance from its full run's end.
        law_ranks_better: The study's backtest found its law ranks the curves' later points
            better than their last losses (`analysis.curves.law_prediction.Backtest`).
        correction: The loss correction applied (`LossCorrection.for_shape` of the study's).
    """

    curve: TrialCurve
    fit: CurveFit
    predicted: CurveFit
    extrapolation_log_sd: float = 0.0
    stored_fit: StoredFit | None = None
    law_ranks_better: bool = False
    correction: LossCorrection = LossCorrection()

    @property
    def ranks_by_prediction(self) -> bool:
        """Whether the prediction may rank the trial (else its loss at equal data ranks it):
        fitted, its extrapolation error within +-20 %, and the study's backtest found its law
        ranks the curves' later points better than their last losses do."""
        return (
            not self.fit.fell_back
            and self.law_ranks_better
            and Z90 * self.extrapolation_log_sd <= TRUSTED_LOG_HALF_WIDTH
        )

    @property
    def points(self) -> tuple[tuple[int, float], ...]:
        """(training samples seen, validation loss) of each evaluation."""
        return tuple(zip(self.curve.samples, self.curve.losses, strict=True))

    @property
    def last_loss(self) -> float:
        """The loss at the trial's own fidelity (the simple objective)."""
        return self.curve.losses[-1]

    @property
    def loss_one_doubling_on(self) -> float:
        """The loss at twice the trial's data if its curve falls as much again
        (`loss_one_doubling_on`): the study's last rung ranks by it."""
        return loss_one_doubling_on(self.curve.samples, self.curve.losses)

    @property
    def method(self) -> str:
        """How the prediction was made: "joint", "own" or "fallback"."""
        return self.fit.method

    @property
    def n_points(self) -> int:
        """The trial's own points behind the prediction."""
        return self.fit.n_points

    def user_attrs(self) -> dict[str, Any]:
        """What the trial keeps in Optuna (the report, the export and later trials read it)."""
        attrs = {
            CURVE_ATTR: [[s, round(loss, 6)] for s, loss in self.points],
            FIT_ATTR: self.fit.to_dict(),
            PREDICTED_ATTR: self.band(),
            LAW_CURVE_ATTR: self.curve.to_attr(),
            METHOD_ATTR: self.method,
            POINTS_ATTR: self.n_points,
        }
        if self.stored_fit is not None:
            attrs[LAW_FIT_ATTR] = self.stored_fit.to_attr()
        return attrs

    def band(self) -> dict[str, float]:
        """The corrected prediction, p10/p50/p90."""
        return loss_band(self.predicted)

    def metrics(self) -> dict[str, float]:
        """Final metrics of the trial's MLflow run."""
        return {
            "predicted_final_loss_p10": self.predicted.p10,
            "predicted_final_loss_p50": self.predicted.p50,
            "predicted_final_loss_p90": self.predicted.p90,
            "predicted_final_loss_uncorrected": self.fit.p50,
            "loss_at_fidelity": self.last_loss,
            "curve_points": float(self.n_points),
            "extrapolation_log_sd": self.extrapolation_log_sd,
        }

    def tags(self) -> dict[str, str]:
        """How the prediction was made (the fallback and why)."""
        tags = {"curve_method": self.fit.method}
        if self.fit.reason:
            tags["curve_reason"] = self.fit.reason
        return tags


def curve_points(eval_records: Sequence[Mapping[str, Any]]) -> tuple[tuple[int, float], ...]:
    """(samples seen, loss) of each evaluation; one point per amount of data (the last)."""
    by_samples: dict[int, float] = {}
    for record in eval_records:
        samples = int(record.get("samples_seen", 0))
        if samples > 0:
            by_samples[samples] = float(record["loss"])
    return tuple(sorted(by_samples.items()))


def predict_final_loss(
    curve: TrialCurve,
    *,
    peers: Sequence[TrialCurve],
    full_run_samples: float,
    correction: LossCorrection,
    full_run_epochs: float | None = None,
) -> FinalLoss:
    """Predict the loss at the end of the trial's full run, fitted with its peers.

    Args:
        curve: The trial's evaluations on its schedule (`trial_curve`).
        peers: Other trials' curves of the same study (`peer_curves`).
        full_run_samples: Training samples the full run sees (samples x epochs).
        correction: The study's fitted correction (the identity before any full run).
        full_run_epochs: The full run's epochs: at most 1, the band is capped at the
            trial's last loss (`one_pass_ceiling`); None (unknown) or more, it is not.
    """
    peers = other_configurations(curve, peers)
    data = [p.data() for p in peers]
    target = curve.data()
    start, warm = _warm_start(peers, [*data, target])
    law = predict_final(target, data, start=start)
    if full_run_epochs is not None and full_run_epochs <= 1.0:
        law = one_pass_ceiling(law, curve.losses[-1])
    fit = _as_curve_fit(law, curve, full_run_samples)
    stored = StoredFit(law.fit.shared, law.fit.log_tau[-1], warm) if law.fit is not None else None
    applied = correction.for_shape(law.shape_identified)
    return FinalLoss(
        curve=curve,
        fit=fit,
        predicted=applied.apply(fit),
        extrapolation_log_sd=law.extrapolation_log_sd,
        law_ranks_better=law.law_ranks_better,
        stored_fit=stored,
        correction=applied,
    )


@dataclass(frozen=True)
class StudyPrediction:
    """A trial's prediction refitted with the curves its study holds now (`study_prediction`).

    Attributes:
        final: The prediction, the loss correction applied.
        curves: Curves in the fit, the trial's own included.
        curve_runs: The study's full runs whose curves it holds (not in the correction).
    """

    final: FinalLoss
    curves: int
    curve_runs: int = 0

    def estimate(self) -> dict[str, Any]:
        """The keys of a preset's `estimate` it sets (those `StudyEstimator.with_final_loss` sets
        at the trial's end, and how many curves the fit took)."""
        return {
            "final_val_loss": self.final.band(),
            "final_val_loss_uncorrected_p50": _sig6(self.final.fit.p50),
            "final_val_loss_method": self.final.method,
            "final_val_loss_points": self.final.n_points,
            "final_val_loss_curves": self.curves,
            "loss_correction": correction_summary(self.final.correction, self.curve_runs),
        }

    def end_band(self) -> dict[str, float]:
        """Its band and curve count, as the study stores it (`END_PREDICTIONS_ATTR`)."""
        return {**self.final.band(), "curves": self.curves}


def study_prediction(
    trial_attrs: Mapping[str, Any],
    other_attrs: Iterable[Mapping[str, Any]],
    study_attrs: Mapping[str, Any],
    *,
    correction: LossCorrection,
    full_run_epochs: float | None = None,
) -> StudyPrediction | None:
    """The trial's final loss predicted again, fitted with every curve the study holds now.

    A trial is predicted when it ends, from the trials before it: the first ones have few
    peers or none, and none has the trials after it nor the curves that went through a decay
    later (the reference run, full runs that reported back). What a study promises at its
    end (its summary, the exported preset) is this refit: the trial's own points, the other
    trials' curves (`other_attrs`, the most recent `MAX_PEERS`) and the study's shape curves
    (rank_fidelity.py: with all 8 trials and the reference instead of the trials before,
    p90 |error| 20-28 % against 59-130 % on the fresh tiny model, and the p50 ranks the full
    runs as well as the loss at equal data).

    `full_run_epochs`: as `predict_final_loss` takes it.

    Returns:
        None when the trial recorded no curve or fit (nothing to refit).
    """
    curve = TrialCurve.from_attr(trial_attrs.get(LAW_CURVE_ATTR))
    recorded = trial_attrs.get(FIT_ATTR)
    if curve is None or not isinstance(recorded, Mapping):
        return None
    try:
        full_run_samples = CurveFit.from_dict(recorded).target
    except (KeyError, TypeError, ValueError):
        return None
    peers = other_configurations(curve, study_peers(other_attrs, study_attrs))
    final = predict_final_loss(
        curve, peers=peers, full_run_samples=full_run_samples, correction=correction,
        full_run_epochs=full_run_epochs,
    )  # fmt: skip
    return StudyPrediction(final, len(peers) + 1, len(curve_run_ids(study_attrs)))


def one_pass_ceiling(law: LawPrediction, last_loss: float) -> LawPrediction:
    """`law` with no percentile above the trial's last loss, plus what two evaluations'
    noise can put between it and the full run's last (or its p50, if higher).

    A full run that sees each sample at most once goes on from the trial's last point down
    the rest of its schedule: in all 160 trial and full-run pairs of `rank_fidelity.py`
    (fresh and pre-trained tiny llama, prompt/completion and chat, trial fractions 0.01-0.1,
    1-epoch full runs of 85-3375 steps) the full run ended below the trial's last loss, while
    the joint fit's p90 lay up to 10^7 times above it where its curves pinned little down.
    The curve goes down; its evaluations scatter around it. Recorded real LoRA runs flatten
    to within their noise by the default's last rung (0.44 of the run: 0.27 % above the end
    at the median, one evaluation's noise about 0.1 %), and 5 of 200 ended above the loss
    they measured there; two of them are among the best, and the replay's last-rung trials
    ended above a p90 at the bare last loss in 16-19 % of cases (the picks in 3-8 %, either
    half of the runs; docs/curve-replay.md, "The last rung's ceiling"). The ceiling adds
    Z90 x sqrt(2) x the noise the fit assumed (`LawPrediction.noise`: the last evaluation's
    and the final one's). Over several epochs a run can overfit, and no ceiling applies
    there. A prediction above the ceiling (a curve that stopped improving) keeps its p50
    and p90 there.
    """
    ceiling = max(float(last_loss) + Z90 * math.sqrt(2.0) * law.noise, law.p50)
    if law.p90 <= ceiling:
        return law
    return replace(law, p90=ceiling, p10=min(law.p10, ceiling))


def _warm_start(
    peers: Sequence[TrialCurve], curves: Sequence[CurveData]
) -> tuple[JointFit | None, int]:
    """The start of a trial's joint fit, and how many warm fits it makes in a row.

    From the most recent peer's stored fit (its shared parameters; each peer's own tau where
    it stored one), unless that was the `COLD_FIT_EVERY`-th warm one in a row: then None (a
    cold fit, counter 0)."""
    latest = next((p.stored_fit for p in reversed(peers) if p.stored_fit is not None), None)
    if latest is None or latest.warm + 1 >= COLD_FIT_EVERY:
        return None, 0
    taus = [p.stored_fit.log_tau if p.stored_fit is not None else None for p in peers]
    return warm_start(curves, latest.shared, [*taus, None]), latest.warm + 1


def _as_curve_fit(law: LawPrediction, curve: TrialCurve, full_run_samples: float) -> CurveFit:
    first = max(curve.samples[0], 1)
    return CurveFit(
        method=law.method, reason=law.reason, a=law.p50, b=0.0, c=0.0, x0=float(first),
        target=max(float(full_run_samples), float(curve.samples[-1]), float(first)),
        p10=law.p10, p50=law.p50, p90=law.p90, n_points=law.n_points,
        residual_sd=0.0, last_loss=curve.losses[-1],
    )  # fmt: skip


def loss_band(fit: CurveFit) -> dict[str, float]:
    """A prediction's p10/p50/p90, as the estimate and the preset carry it."""
    return {"p10": _sig6(fit.p10), "p50": _sig6(fit.p50), "p90": _sig6(fit.p90)}


def correction_summary(correction: LossCorrection, curve_runs: int = 0) -> dict[str, Any]:
    """The correction an estimate was made with: its factor, how many full runs it rests on
    and (`curve_runs`) how many of the study's own full runs' curves the fit holds instead."""
    out: dict[str, Any] = {"scale": _sig6(correction.scale), "runs": correction.n_runs}
    if curve_runs:
        out["curve_runs"] = curve_runs
    return out


def _sig6(value: float) -> float:
    return float(f"{value:.6g}")
