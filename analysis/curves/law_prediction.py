"""A trial's predicted loss at its full run's end, from the law fitted across the study, and
its p10-p90 band.

`analysis.curves.law` fits the schedule-aware law to all curves at once; this module decides
when that fit can be trusted (or falls back), and how wide the band is. The band comes from
the fit's own uncertainty once the study has identified its loss shape (some curve went
through a decay of its own: the reference run, a full run that reported back):

* leave curves out: the shared parameters refitted without each group of curves (a
  delete-group jackknife, at most `groups` refits), and the spread of the target's
  prediction over them: how much the prediction rests on any one curve. Where two or more
  of the target's peers went through a decay, leaving one out shows how much the prediction
  rests on which configuration's decay it borrowed. Where only one did (the reference run
  alone, one full run, the other trial of the last rung), that curve stays in every refit:
  leaving it out would hold the annealing term at 0, or leave it to the target's own decay
  seen in part, and the spread would be the error of another prediction, not of this one.
  Where the backtest's half cut stands where
  the target does (it holds at least half of each curve's points: the last rung, the pick),
  the backtest's refits measure this too, and only the larger of the two counts;
* the target's own points: the shift of its prediction when its last point is left out;
* the fit's residual sd (one evaluation's noise at least);
* how far the target's end lies beyond the reach of every curve on the shared shape
  (ln(S1 / tau), tau a curve's own speed), times the prior's error per unit of distance:
  up to there the curves pin the shape down, beyond it the law extrapolates;
* the target's own distance to its end times `SHAPED_LOG_SD`: configurations differ in more
  than their speed along the shared shape, and a curve that reaches past the target's end
  does not say where the target's own curve goes. Twice that (`ONE_SHAPE_LOG_SD`) where
  one curve alone went through a decay: one configuration's decay says less about
  another's than several do, and the jackknife cannot measure it.

Where C rests on decays seen in part only (a rung's trial stops partway through its run's
decay; the default's last rung sees 34-41 % of it, one under a search budget 4-15 %), C also
absorbs how the curve bends, and the law's end can lie far below the outcome: the p50 then
lies the share of the decay seen of the way down from the law without annealing to the law
with it, and the band reaches toward both (`_partly_annealed`). A whole run through its
decay (a full run that reported back, the reference run) leaves the fitted law as it is.

A curve of one or two points at the study's starting loss shows no speed of its own: it is
taken at the slowest speed a curve of 3 or more points showed (`_speeds`), not at the slowest
the fit allows (which ends the run where it started).

Before the shape is identified no curve in the study says how a run ends, and the band
adds an extrapolation error per unit of ln(S1 at the end / S1 at the last point).
Everywhere the study's curves can be backtested (`backtest`: half of each curve predicting
its other half; cut to as many points as the target has where that is fewer, so the error is
measured about as far out as the target extrapolates), the per-unit errors above are what
that backtest measured, at least `SPREAD_LOG_SD` x the spread of the curves' predicted ends:
as wide as this study's curves are unpredictable (on recorded real LoRA curves the
tiny-model priors made the band 100x its error, docs/curve-replay.md). The priors
(`EXTRAPOLATION_LOG_SD`, `SHAPED_LOG_SD`, `ONE_SHAPE_LOG_SD`) stay where fewer than 3
curves can be cut. The prior's error also
bounds whether a prediction may rank trials (`hpo.final_loss.TRUSTED_LOG_HALF_WIDTH`),
with the backtest's own verdict on whether the law ranks better than the last losses.

Pure numpy/scipy: imports nothing from the project but `analysis.curves.law` and
`analysis.curves.noise`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.curves.law import CurveData, JointFit, fit_joint, noise_sd
from analysis.curves.noise import Z90

JOINT, OWN, FALLBACK = "joint", "own", "fallback"
METHODS = (JOINT, OWN, FALLBACK)
_OWN_MIN_POINTS = 6  # a curve alone must carry the five shared parameters and its tau
_RISING_RATIO = 1.02
_NOISE_FLOOR = 1e-3  # of the loss: evaluations are never more exact than this
_ANNEALING_SEEN = 0.2  # a curve that saw this share of its run's annealing identifies C
# Where none did, curves that saw at least this share identify C, less surely: a search
# budget scales the last rung down to a few percent of its decay, and with C held at 0 the
# band, measured on stretches of curves where the rate barely fell, missed the decay's
# effect (docs/curve-replay.md, "A decay glimpsed under a budget").
_ANNEALING_GLIMPSED = 0.05
_WHOLE_DECAY = 0.999  # a curve that saw this share saw its whole decay (a full run's)
_MAX_ANNEALING = 1.0  # C's bound once identified (loss per peak-rate step of annealing)
_BACKTEST_QUANTILE = 0.8  # the backtest's error per unit of extrapolation taken for p10/p90
_BACKTEST_MIN_CURVES = 3
_PLACED_MIN_POINTS = 3  # a curve of this many points shows its own speed (`_speeds`)
_REFIT_MAX_NFEV = 30  # refits for the band start from the fit: a few steps move them
LEAVE_OUT_GROUPS = 8
MAX_LOG_HALF_WIDTH = math.log(1e6)  # a band wider than this says nothing more
WARM_MAX_NFEV = 100  # a fit from the last trial's parameters moves little
# The least log sd of a prediction per unit of ln(S1 at the end / S1 at the last point),
# where no curve of the study went through a decay: about 80 % of the recorded tiny-model
# full runs end inside 0.45 x Z90 of their p50 per unit, the hardest sets included. A
# study's own backtest sees only short extrapolations (half a trial's curve), which miss
# most of this error, so it can only raise it. Measurements: docs/notes/tuned-constants.md.
EXTRAPOLATION_LOG_SD = 0.45
# Where no curve went through a decay and the study's curves can be backtested, the band's
# log sd per unit of distance is what the backtest measured, and at least this many times
# the spread (sd of ln) of the curves' last losses: configurations that end far apart
# extrapolate less surely than ones that end close together, and a backtest of half-curves
# sees only short extrapolations. See docs/curve-replay.md for how it was chosen.
SPREAD_LOG_SD = 0.25
# The least log sd per unit of the target's own distance once the shape is identified: how
# far a configuration ends from where the shared shape carries its first points. Without it
# the band rests on the curves' reach alone, and a full run that reported back (its curve
# reaches every trial's end) narrows it below the errors it should cover. The smallest value
# that kept about 80 % of full runs inside p10-p90 (docs/notes/tuned-constants.md).
SHAPED_LOG_SD = 0.05
# The same where one curve alone went through a decay (the study's reference run before any
# full run reported back, or one full run without a reference), which the jackknife then
# keeps in every refit: one configuration's decay says less about another's than several
# do. Twice the shaped value kept every recorded set at 80 % or more inside p10-p90, where
# leaving the one decayed curve out of the jackknife made the band far wider
# (docs/notes/tuned-constants.md).
ONE_SHAPE_LOG_SD = 2 * SHAPED_LOG_SD


@dataclass(frozen=True)
class LawPrediction:
    """A trial's predicted loss at its full run's end and how it was made.

    Attributes:
        p10: 10th percentile.
        p50: Median.
        p90: 90th percentile.
        method: "joint" (fitted with other trials), "own" (its curve alone) or "fallback".
        reason: Why it fell back ("" otherwise).
        n_points: The trial's own points.
        n_curves: Curves in the fit (1 for "own", 0 for a fallback without peers).
        extrapolation_log_sd: The extrapolation error prior's log sd at this distance (0:
            none); what decides whether the prediction may rank trials.
        shape_identified: Whether a curve of the fit went through a decay (the band then
            comes from the fit's own uncertainty, not the prior).
        fit: The joint fit behind it (None for a fallback): a later trial's warm start.
        law_ranks_better: The study's backtest found the law ranks its curves' later points
            better than their last losses do (`Backtest`): its p50 may rank trials.
        noise: One evaluation's noise sd (loss units) the fit assumed (0: not known).
    """

    p10: float
    p50: float
    p90: float
    method: str
    reason: str
    n_points: int
    n_curves: int
    extrapolation_log_sd: float = 0.0
    shape_identified: bool = False
    fit: JointFit | None = None
    law_ranks_better: bool = False
    noise: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS} but got {self.method=}")
        if not (math.isfinite(self.p90) and 0 <= self.p10 <= self.p50 <= self.p90):
            raise ValueError(
                f"need 0 <= p10 <= p50 <= p90 but got {self.p10=}, {self.p50=}, {self.p90=}"
            )


def predict_final(
    target: CurveData,
    peers: Sequence[CurveData],
    *,
    groups: int = LEAVE_OUT_GROUPS,
    start: JointFit | None = None,
) -> LawPrediction:
    """Predict `target`'s loss at its full run's end from its curve and its peers' curves.

    Rules, in order: a curve whose last two losses both rose 2 % above its minimum falls
    back (no decay to extrapolate); with no peer, a curve of fewer than 6 points falls back
    (nothing shows the shape); else the law is fitted to all curves (`fit_shared`) and p50
    is its value at the end. The band adds in quadrature, in log space: the spread of the
    prediction over refits that leave groups of curves out (at most `groups`), the shift
    when the target's last point is left out, the fit's residual sd, and the extrapolation
    error per unit of distance: what the study's own `backtest` measured (at least
    `SPREAD_LOG_SD` x the spread of the curves' predicted ends) where 3 curves can be cut,
    else the priors. While no curve went through a decay (C unidentified) it applies over
    the target's whole distance (prior `EXTRAPOLATION_LOG_SD`); after, over the distance
    beyond the curves' reach (prior `EXTRAPOLATION_LOG_SD`) and the target's whole distance
    (prior `SHAPED_LOG_SD`, `ONE_SHAPE_LOG_SD` where one curve alone went through a decay),
    this last one or the jackknife's, the larger, where the backtest's half cut stands
    where the target does (`Backtest.at_half`).
    Where every curve through a decay saw only part of it, the p50 and the band move toward
    the law without annealing (`_partly_annealed`).

    Args:
        target: The trial's curve.
        peers: The other curves of the study.
        groups: The most refits the jackknife makes.
        start: An earlier fit of these curves (`analysis.curves.law.warm_start`, in the order
            peers then target): one fit from it, capped at `WARM_MAX_NFEV` evaluations,
            instead of the two-start fit.

    Raises:
        ValueError: `target` has no points.
    """
    if target.losses.size == 0:
        raise ValueError("target must hold at least one point")
    peers = [p for p in peers if p.losses.size > 0]
    last, lowest = float(target.losses[-1]), float(np.min(target.losses))
    n = int(target.losses.size)
    if n >= 3 and float(np.min(target.losses[-2:])) > _RISING_RATIO * lowest:
        return _fallback(target, peers, f"loss rose from its minimum {lowest:.4g} to {last:.4g}")
    if not peers and n < _OWN_MIN_POINTS:
        return _fallback(target, peers, f"{n} points and no other trial to share the shape")
    curves = [*peers, target]
    fit, noise, max_annealing = fit_shared(
        curves, start=start, max_nfev=WARM_MAX_NFEV if start is not None else None
    )
    p50 = _end(fit, curves, len(curves) - 1, noise)
    if not (math.isfinite(p50) and p50 > 0):
        return _fallback(target, peers, f"the law gives {p50:.4g} at the run's end")
    identified = max_annealing > 0
    shaped_log_sd = ONE_SHAPE_LOG_SD if len(_decayed(curves)) == 1 else SHAPED_LOG_SD
    prior = EXTRAPOLATION_LOG_SD * _distance(target)
    # Cut to as many points as the target has: its error at the target's own distance.
    checked = backtest(curves, max_annealing, noise, fit, points=n)
    # Per unit of the target's distance: what this study's curves measured where they could
    # be backtested (at least SPREAD_LOG_SD x their spread), else the priors.
    measured = (
        max(checked.log_sd, SPREAD_LOG_SD * _log_spread(fit, curves, noise))
        if checked.checks
        else None
    )
    beyond_log_sd = EXTRAPOLATION_LOG_SD  # per unit beyond every curve's reach
    if measured is not None:
        shaped_log_sd = beyond_log_sd = measured
    if not identified:
        prior = (EXTRAPOLATION_LOG_SD if measured is None else measured) * _distance(target)
    rests = leave_out_log_spread(curves, fit, noise, groups)
    shaped = shaped_log_sd * _distance(target) if identified else 0.0
    if identified and measured is not None and checked.at_half:
        # The half cut stands where the target does (it holds at least half of each curve's
        # points: the last rung, the pick): its refits' errors already hold how much a
        # prediction rests on which curves, and the two measure one uncertainty: the larger
        # counts, not both (the pick's band held 100 % at 5x its error). Where the cut is to
        # the target's few points, the curves cut are ones that went on, and both count
        # (docs/curve-replay.md, "The jackknife counted twice").
        rests, shaped = 0.0, max(rests, shaped)
    terms = (
        rests,
        _own_points_log_shift(curves, fit, max_annealing, noise),
        max(noise, fit.residual_sd) / p50,
        beyond_log_sd * _beyond_the_curves(fit, curves, noise) if identified else prior,
        shaped,
    )
    half = log_half_width(Z90 * math.sqrt(sum(t**2 for t in terms)))
    p50, lower, upper = _partly_annealed(curves, fit, noise, p50, half)
    return LawPrediction(
        p10=p50 * math.exp(-lower), p50=p50, p90=p50 * math.exp(upper),
        method=JOINT if peers else OWN, reason="", n_points=n, n_curves=len(curves),
        extrapolation_log_sd=EXTRAPOLATION_LOG_SD * _distance(target) if identified else prior,
        shape_identified=identified, fit=fit, law_ranks_better=checked.law_ranks_better,
        noise=noise,
    )  # fmt: skip


def log_half_width(value: float) -> float:
    """A band's log half-width, at most `MAX_LOG_HALF_WIDTH`.

    A law that ends near 0 makes the noise term (noise / p50) huge: a p50 of 4e-4 with an
    evaluation noise of 0.3 gave a log half-width of 1054, and exp() of it overflowed (seen
    on `rank_fidelity.py`'s recorded pre-trained runs with a forward power of 0.25). A band
    a million-fold each side already says "unknown"; the one-epoch ceiling then caps p90.
    """
    return min(value, MAX_LOG_HALF_WIDTH) if math.isfinite(value) else MAX_LOG_HALF_WIDTH


def fit_shared(
    curves: Sequence[CurveData], *, start: JointFit | None = None, max_nfev: int | None = None
) -> tuple[JointFit, float, float]:
    """The law fitted jointly to `curves` (the last one's level sets the noise floor).

    C is fitted (bounded by 1 loss unit per peak-rate step of annealing) only when some
    curve saw at least 20 % of its run's annealing in 6 or more evaluations (where none did,
    5 %: `_decayed`), else held at 0: a curve that ran through a decay of its own (the
    study's reference run, a full run that reported back, a rung's trial partway) is what
    identifies it.

    Returns:
        The fit, one evaluation's noise it assumed, and C's upper bound.
    """
    noise = max(noise_sd(curves), _NOISE_FLOOR * float(np.median(curves[-1].losses)))
    max_annealing = _MAX_ANNEALING if _annealing_seen(curves) else 0.0
    fit = fit_joint(
        curves, f_scale=2.0 * noise, max_annealing=max_annealing, start=start, max_nfev=max_nfev
    )
    return fit, noise, max_annealing


def _annealing_seen(curves: Sequence[CurveData]) -> bool:
    return bool(_decayed(curves))


def _decayed(curves: Sequence[CurveData]) -> list[int]:
    """The curves that went through a decay of their own (each identifies C): at least 20 %
    of their run's annealing, in at least `_OWN_MIN_POINTS` evaluations (a whole run of 3
    steps at a large batch, which a rung can be, cannot tell its decay from its descent: on
    the demo study such a run set C for a run of 169 steps, 4x too much). Where no curve
    saw 20 %, those that saw `_ANNEALING_GLIMPSED`: under a search budget of 0.75-1 full
    runs the last rung sees 4-15 % of a cosine decay, and with C held at 0 the recorded real
    LoRA runs' picks ended 0.47-0.65 % below their p50 at the median (at 0.75 full runs 72 %
    inside p10-p90), the tiny-model sets' picks at 0.75 full runs 2 of 11 inside; the decay
    seen in part (`_partly_annealed`) then reaches toward both laws."""

    def seen(share: float) -> list[int]:
        return [
            i for i, c in enumerate(curves)
            if c.s2_end > 0 and float(c.s2[-1]) >= share * c.s2_end
            and c.losses.size >= _OWN_MIN_POINTS
        ]  # fmt: skip

    return seen(_ANNEALING_SEEN) or seen(_ANNEALING_GLIMPSED)


def decay_seen(curves: Sequence[CurveData]) -> float:
    """The largest share of its run's annealing area (S2) any curve through a decay saw (0
    when none did): 1 once a full run or the reference run reported its whole decay."""
    shares = [min(float(curves[i].s2[-1]) / curves[i].s2_end, 1.0) for i in _decayed(curves)]
    return max(shares, default=0.0)


def _partly_annealed(
    curves: Sequence[CurveData], fit: JointFit, noise: float, p50: float, half: float
) -> tuple[float, float, float]:
    """(p50, lower, upper log half-widths) where C rests on decays seen in part only.

    A rung's trial stops partway through its run's decay (the default's last rung at 0.44
    of a linear or cosine schedule sees 34-41 % of the annealing area): C then also absorbs
    how the curve bends, and the law's end can lie far below the outcome (the demo study's
    pick at seeds 0-4: every full run above p90, one by 9x; each ended between the law
    without annealing and the law with it, at 5-57 % of the way down; on the recorded real
    LoRA runs the pick's at 21-125 %, median 66 %, a gap of about 0.4 %). The law without
    annealing (C held at 0) is refitted, and where it ends higher, the p50 lies the share of
    the decay seen of the way down from it (geometrically), and the band adds, in
    quadrature with its other terms, the ways to `seen`^2 of the way (up) and to `seen` +
    (1 - `seen`)^2 (down): the whole way at `seen` 0, nothing at 1. No constant was tuned:
    the share seen sets both (docs/curve-replay.md, "A decay seen in part").
    """
    seen = decay_seen(curves)
    if not 0.0 < seen < _WHOLE_DECAY:
        return p50, half, half
    plain = fit_joint(
        curves, f_scale=2.0 * noise, max_annealing=0.0,
        start=JointFit((*fit.shared[:4], 0.0), fit.log_tau, 0, 0), max_nfev=WARM_MAX_NFEV,
    )  # fmt: skip
    unannealed = _end(plain, curves, len(curves) - 1, noise)
    if not (math.isfinite(unannealed) and unannealed > p50):
        return p50, half, half
    gap = math.log(unannealed / p50)
    lower = log_half_width(math.hypot(half, (1.0 - seen) ** 2 * gap))
    upper = log_half_width(math.hypot(half, seen * (1.0 - seen) * gap))
    return p50 * math.exp((1.0 - seen) * gap), lower, upper


def _log_spread(fit: JointFit, curves: Sequence[CurveData], noise: float) -> float:
    """The sd of ln(the fit's end) over `curves`: how far apart the study's configurations
    end, whatever share of their runs each curve reached."""
    speeds = _speeds(fit, curves, noise)
    ends = [float(fit.loss_at(v, c.s1_end, c.s2_end)) for v, c in zip(speeds, curves, strict=True)]
    logs = [math.log(v) for v in ends if math.isfinite(v) and v > 0]
    return float(np.std(logs)) if len(logs) > 1 else 0.0


def _distance(curve: CurveData) -> float:
    """How far a prediction extrapolates: ln(S1 at the end / S1 at the last point)."""
    return max(math.log(curve.s1_end / float(curve.s1[-1])), 0.0)


def _beyond_the_curves(fit: JointFit, curves: Sequence[CurveData], noise: float) -> float:
    """How far the last curve's end lies beyond every point the fit saw, on the shared
    shape: ln(S1 / tau) at its end less the largest ln(S1 / tau) of any curve's last point
    (0 when some curve reached further). Up to there the curves pin the shape down; beyond
    it the law extrapolates, and the prior's error per unit of distance applies."""
    speeds = _speeds(fit, curves, noise)
    reach = max(math.log(float(c.s1[-1])) - v for v, c in zip(speeds, curves, strict=True))
    end = math.log(curves[-1].s1_end) - speeds[-1]
    return max(end - reach, 0.0)


def _log_end(fit: JointFit, curves: Sequence[CurveData], noise: float) -> float | None:
    value = _end(fit, curves, len(curves) - 1, noise)
    return math.log(value) if math.isfinite(value) and value > 0 else None


def _end(fit: JointFit, curves: Sequence[CurveData], index: int, noise: float) -> float:
    """Curve `index`'s loss at its run's end, at its speed (`_speeds`)."""
    curve = curves[index]
    speed = _speeds(fit, curves, noise)[index]
    return float(fit.loss_at(speed, curve.s1_end, curve.s2_end))


def _speeds(fit: JointFit, curves: Sequence[CurveData], noise: float) -> list[float]:
    """Each curve's ln tau, held at the slowest of the curves that show their own speed
    (`_PLACED_MIN_POINTS` points or more) where its own points do not: fewer of them, its
    last within Z90 x `noise` of the study's starting loss (L0 + D) or above it.

    Such points fit any speed slow enough, and the fit takes the slowest it allows (ln tau
    at its bound, or near it): the law then ends where the run started, less the
    annealing. On the recorded real LoRA runs half of a study's end predictions are of
    trials stopped at their one evaluation (15 steps of 750, inside the warmup), and 21-28 %
    of those were predicted so, 7-9 % above outcomes that ended with the others'
    (docs/curve-replay.md, "A speed no point shows"). S1 already counts the learning rate,
    so tau is what the rate does not explain (batch, rank): the slowest the study has placed
    is what such a curve is taken at, not slower.
    """
    placed = [
        t for t, c in zip(fit.log_tau, curves, strict=True) if c.losses.size >= _PLACED_MIN_POINTS
    ]
    if not placed:
        return list(fit.log_tau)
    slowest, start = max(placed), fit.shared[0] + fit.shared[1]
    return [
        min(t, slowest)
        if c.losses.size < _PLACED_MIN_POINTS and c.losses[-1] >= start - Z90 * noise
        else t
        for t, c in zip(fit.log_tau, curves, strict=True)
    ]


def leave_out_log_spread(
    curves: Sequence[CurveData], fit: JointFit, noise: float, groups: int = LEAVE_OUT_GROUPS
) -> float:
    """The jackknife sd of ln(the last curve's prediction) over refits that leave one group
    of the other curves out (round-robin into at most `groups` groups).

    A prediction of the end that moves when one curve is left out rests on that curve: the
    spread is how well the study's curves pin down the shared parameters at the target's
    end. The one curve of the others that went through a decay, where only one did, stays in
    every refit: without it C is held at 0, and the refit answers another question (the end
    without any decay, about twice too high on the recorded runs) than how sure this
    prediction is. The target's own decay does not count: a last-rung trial sees part of
    its (34-41 % of the area at the default's 0.44 of the run), and C fitted to that alone
    absorbs the curve's bend. The demo study's pick, predicted with the other last-rung trial
    left out, ended below 0 and its band read 0.0105 to 321 around 1.84, the full run 11 %
    off (docs/curve-replay.md, "The target's own decay in the jackknife"). A refit whose
    prediction is not positive counts as a 100-fold move. 0 with fewer than 2 other curves
    to leave out.
    """
    others = len(curves) - 1
    decayed = [i for i in _decayed(curves) if i < others]
    kept = decayed if len(decayed) == 1 else []
    free = [i for i in range(others) if i not in kept]
    g = min(groups, len(free))
    if g < 2:
        return 0.0
    base = _log_end(fit, curves, noise)
    assert base is not None
    values = []
    for group in range(g):
        keep = sorted([*kept, *(i for k, i in enumerate(free) if k % g != group)])
        sample = [*(curves[i] for i in keep), curves[-1]]
        start = JointFit(fit.shared, (*(fit.log_tau[i] for i in keep), fit.log_tau[-1]), 0, 0)
        refit, _, _ = fit_shared(sample, start=start, max_nfev=_REFIT_MAX_NFEV)
        value = _log_end(refit, sample, noise)
        values.append(base - math.log(100.0) if value is None else value)
    spread = np.asarray(values) - float(np.mean(values))
    return float(math.sqrt((g - 1) / g * float(np.sum(spread**2))))


def _own_points_log_shift(
    curves: Sequence[CurveData], fit: JointFit, max_annealing: float, noise: float
) -> float:
    """|ln| of how far the target's prediction moves when its last point is left out: how
    firmly its own few points place it on the shared shape."""
    target = curves[-1]
    if target.losses.size < 3:
        return 0.0
    cut = CurveData(
        target.s1[:-1], target.s2[:-1], target.losses[:-1], target.s1_end, target.s2_end
    )
    sample = [*curves[:-1], cut]
    refit = fit_joint(
        sample, f_scale=2.0 * noise, max_annealing=max_annealing, start=fit,
        max_nfev=_REFIT_MAX_NFEV,
    )  # fmt: skip
    value, base = _log_end(refit, sample, noise), _log_end(fit, curves, noise)
    assert base is not None
    return abs(base - value) if value is not None else math.log(100.0)


@dataclass(frozen=True)
class Backtest:
    """What the study's own curves say of its law: each curve's later points predicted from
    its first points and the other curves.

    Attributes:
        log_sd: The law's log error per unit of extrapolation distance (its 80th percentile
            / Z90), from the cross-fitted cut at the target's own points where `backtest`
            was given them (else the half cut's); 0 where fewer than `_BACKTEST_MIN_CURVES`
            curves could be cut.
        law_ranks_better: Whether the law's predictions of the cut curves' last points rank
            them better (Spearman) than the cut curves' own last losses do: only then may
            its p50 rank trials.
        checks: The curves that were cut and predicted.
        at_half: `log_sd` is the half cut's because the target holds at least half of each
            curve's points (or no target was given): the cuts stand where it stands.
    """

    log_sd: float = 0.0
    law_ranks_better: bool = False
    checks: int = 0
    at_half: bool = False


def backtest(
    curves: Sequence[CurveData], max_annealing: float, noise: float,
    start: JointFit | None = None, points: int | None = None,
) -> Backtest:  # fmt: skip
    """The law backtested on the study's curves (`Backtest`).

    Every curve of at least 3 points is cut to its first half, the cut curves (and the
    shorter ones whole) are fitted jointly, and each cut curve's last observed loss is
    predicted: Spearman of the predictions against the observed, against the cut curves'
    last losses, says whether the law ranks better. |ln(observed / predicted)| / ln(S1 last
    / S1 at the cut), its 80th percentile / Z90, is the log sd per unit of ln S1 ratio.
    `start`: the fit of the whole curves (the cut ones start from it), else a cold fit.

    `points`: the target's own points. Where the half of some curve holds more, the log sd
    per unit is measured as the target is predicted (`_cross_cut`): each curve cut to at
    most that many points and predicted with the other curves whole, over about the
    target's distance. On the recorded real LoRA runs the half cut's error per unit,
    measured at about 0.8 units, made the band of a trial stopped at its first evaluation
    (4.4 units from its end) hold 98 % at about 6x its median error (docs/curve-replay.md,
    "The backtest at the target's own points", "Each configuration once, and the backtest
    cross-fitted"). A target with at least half of every curve's points (the last rung, the
    pick) keeps the half cut: cross-fitted there too, the tiny-model sets' bands with full
    runs (`benchmarks/band_coverage.py`) held one set at 46 % where it held 58 %.
    """
    half = _cut_and_predict(curves, max_annealing, noise, start)
    if half is None:
        return Backtest()
    better = _rank_agreement(half.law, half.observed) > _rank_agreement(half.last, half.observed)
    per_unit = [e / d for e, d in zip(half.errors, half.distances, strict=True)]
    at_half = points is None or all(c.losses.size // 2 <= points for c in curves)
    if points is not None and not at_half:
        matched = _cross_cut(curves, max_annealing, noise, start, points)
        if matched is not None:
            per_unit = [e / d for e, d in zip(matched.errors, matched.distances, strict=True)]
    log_sd = float(np.quantile(per_unit, _BACKTEST_QUANTILE)) / Z90
    return Backtest(log_sd, better, len(half.errors), at_half)


@dataclass(frozen=True)
class _Cut:
    """One backtest's predictions of its cut curves' last observed losses (aligned lists)."""

    errors: list[float] = field(default_factory=list)  # |ln(observed / predicted)|
    distances: list[float] = field(default_factory=list)  # ln(S1 at the last / at the cut)
    law: list[float] = field(default_factory=list)  # the predictions
    last: list[float] = field(default_factory=list)  # the cut curves' last losses
    observed: list[float] = field(default_factory=list)

    def add(self, predicted: float, cut: CurveData, whole: CurveData) -> None:
        """`whole`'s last loss, predicted as `predicted` from `cut` (its first points)."""
        distance = math.log(float(whole.s1[-1]) / float(cut.s1[-1]))
        if predicted > 0 and distance > 0:
            observed = float(whole.losses[-1])
            self.errors.append(abs(math.log(observed / predicted)))
            self.distances.append(distance)
            self.law.append(predicted)
            self.last.append(float(cut.losses[-1]))
            self.observed.append(observed)


def _first(curve: CurveData, keep: int) -> CurveData:
    return CurveData(
        curve.s1[:keep], curve.s2[:keep], curve.losses[:keep], curve.s1_end, curve.s2_end
    )


def _cut_and_predict(
    curves: Sequence[CurveData], max_annealing: float, noise: float, start: JointFit | None
) -> _Cut | None:
    """Every curve of at least 3 points cut to its first half, the cut curves (and the others
    whole) fitted jointly, and each cut curve's last observed loss predicted at its fitted
    speed. None where fewer than `_BACKTEST_MIN_CURVES` could be predicted."""
    keeps = _cuttable(curves)
    if len(keeps) < _BACKTEST_MIN_CURVES:
        return None
    fit, cut = _fit_cut(curves, keeps, max_annealing, noise, start)
    out = _Cut()
    for i in keeps:
        out.add(
            float(fit.loss_at(fit.log_tau[i], curves[i].s1[-1], curves[i].s2[-1])),
            cut[i],
            curves[i],
        )
    return out if len(out.errors) >= _BACKTEST_MIN_CURVES else None


def _cross_cut(
    curves: Sequence[CurveData], max_annealing: float, noise: float, start: JointFit | None,
    at_most: int,
) -> _Cut | None:  # fmt: skip
    """Every curve of at least 3 points cut to at most `at_most` points (at most its half) and
    its last observed loss predicted as the band's target is: with the other curves whole.

    The curves to cut are ordered by length and dealt alternately into two folds (curves of
    one length fall in both), and each fold is cut and fitted with the other whole: two fits
    where the cut at once was one. Each cut curve is read at the speed the band reads it at
    (`_speeds`), where one or two points at the starting loss would otherwise end where they
    started. Cutting every curve at once (the backtest before) left no curve to pin the
    shape beyond the cut: on the recorded real LoRA runs a trial of the second rung (6
    points) was backtested with the two last-rung curves cut to 6 points too, 3-5 % off at
    the 80th percentile, where its own end prediction, with them whole, was 0.3 % off at the
    median. None where fewer than `_BACKTEST_MIN_CURVES` could be predicted."""
    keeps = _cuttable(curves, at_most)
    if len(keeps) < _BACKTEST_MIN_CURVES:
        return None
    order = sorted(keeps, key=lambda i: (curves[i].losses.size, i))
    out = _Cut()
    for fold in (order[0::2], order[1::2]):
        fit, cut = _fit_cut(curves, {i: keeps[i] for i in fold}, max_annealing, noise, start)
        speeds = _speeds(fit, cut, noise)
        for i in fold:
            out.add(
                float(fit.loss_at(speeds[i], curves[i].s1[-1], curves[i].s2[-1])), cut[i], curves[i]
            )
    return out if len(out.errors) >= _BACKTEST_MIN_CURVES else None


def _cuttable(curves: Sequence[CurveData], at_most: int | None = None) -> dict[int, int]:
    """Each curve of at least 3 points that a cut to its first half (at most `at_most`
    points) shortens: its index -> the points it keeps, in the curves' order."""
    keeps = {}
    for i, c in enumerate(curves):
        if c.losses.size >= 3:
            keep = c.losses.size // 2 if at_most is None else min(c.losses.size // 2, at_most)
            if c.s1[-1] > c.s1[keep - 1]:
                keeps[i] = keep
    return keeps


def _fit_cut(
    curves: Sequence[CurveData], keeps: dict[int, int], max_annealing: float, noise: float,
    start: JointFit | None,
) -> tuple[JointFit, list[CurveData]]:  # fmt: skip
    """The curves in `keeps` cut to their first points, the others whole, fitted jointly from
    `start` (a short warm fit) or cold."""
    cut = [_first(c, keeps[i]) if i in keeps else c for i, c in enumerate(curves)]
    fit = fit_joint(
        cut, f_scale=2.0 * noise, max_annealing=max_annealing, start=start,
        max_nfev=WARM_MAX_NFEV if start is not None else 200,
    )  # fmt: skip
    return fit, cut


def _rank_agreement(predicted: Sequence[float], observed: Sequence[float]) -> float:
    """Spearman's rank correlation (ties by order: the backtest's losses seldom tie)."""
    a = np.argsort(np.argsort(np.asarray(predicted)))
    b = np.argsort(np.argsort(np.asarray(observed)))
    if np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def _fallback(target: CurveData, peers: Sequence[CurveData], reason: str) -> LawPrediction:
    """The last loss, scaled by how much the peers' curves say is left; band from them.

    With peers, each peer's ratio (law's end / its last loss, from a joint fit of the peers)
    is one plausible outcome: p50 is the last loss times their median ratio, and the band
    spans their 10th-90th percentile ratios, the last loss itself (a curve that stopped
    improving may stay there) and the extrapolation's error at this distance. With no peer:
    p50 = p90 = the last loss (a decaying schedule seldom ends above it), p10 the
    extrapolation's error below it.
    """
    last = float(target.losses[-1])
    n = int(target.losses.size)
    half = log_half_width(Z90 * EXTRAPOLATION_LOG_SD * _distance(target))
    if len(peers) >= 2:
        noise = max(noise_sd(peers), _NOISE_FLOOR * last)
        fit = fit_joint(peers, f_scale=2.0 * noise, max_annealing=0.0)
        ratios = [fit.predict_end(i, p) / float(p.losses[-1]) for i, p in enumerate(peers)]
        q10, q50, q90 = (float(q) for q in np.quantile(ratios, [0.1, 0.5, 0.9]))
        p50 = last * q50
        p10 = min(last * q10, p50 * math.exp(-half))
        p90 = max(last * q90, last, p50 * math.exp(half))
        return LawPrediction(max(p10, 0.0), p50, p90, FALLBACK, reason, n, len(peers), noise=noise)
    return LawPrediction(last * math.exp(-half), last, last, FALLBACK, reason, n, 0)
