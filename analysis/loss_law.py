"""The loss of a run as a function of its learning-rate schedule, fitted across a study.

Tissue et al., "Scaling Law with Learning Rate Annealing" (NeurIPS 2025, arXiv 2408.11029)::

    L(s) = L0 + A * S1(s) ** (-alpha) - C * S2(s)

S1(s) is the area under the learning-rate curve up to optimizer step s (the "forward
area"), S2(s) the annealing area: a momentum-weighted sum of the rate's drops,
m_i = decay * m_(i-1) + (eta_(i-1) - eta_i), S2(s) = sum of m_i up to s. Both are in units
of the run's peak rate (a step at the peak rate adds 1 to S1), so A absorbs how fast a
configuration learns per step and C is the loss one unit of annealing removes.

A trial is the start of its full run: it knows the full run's whole schedule (warm-up,
decay, step count) from `analysis.lr_schedule.learning_rates`, which reproduces transformers' schedulers, so
the law predicts the loss at the full run's last step with its decay included.

The study's trials share the model and the data, so the exponent, the annealing
coefficient and the loss floor L0 are shared: `fit_joint` fits all trials at once, each
keeping its own amplitude A. A 6-point curve then borrows the shape the other trials
show. The band of a prediction comes from refits on resampled trials (their disagreement)
and resampled residuals (one evaluation's noise).

Pure numpy/scipy: imports nothing from the project but `analysis.curve_noise` and
`analysis.lr_schedule`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

from analysis.curve_noise import MAD_TO_SD, Z90, chord_deviations
from analysis.lr_schedule import ANNEALING_DECAY, schedule_areas

FloatArray = NDArray[np.float64]

_ALPHA_BOUNDS = (0.05, 3.0)


@dataclass(frozen=True)
class CurveData:
    """One trial's points for the law: its areas at each evaluation and at the full run's end.

    Attributes:
        s1: S1 at each evaluated step (> 0, increasing).
        s2: S2 at each evaluated step.
        losses: Validation loss at each evaluated step.
        s1_end: S1 at the full run's last step.
        s2_end: S2 at the full run's last step.
    """

    s1: FloatArray
    s2: FloatArray
    losses: FloatArray
    s1_end: float
    s2_end: float

    def __post_init__(self) -> None:
        if not (self.s1.shape == self.s2.shape == self.losses.shape and self.s1.ndim == 1):
            raise ValueError(
                f"s1, s2 and losses must be 1-D of one length but got {self.s1.shape=}"
            )
        if self.s1.size and (np.any(self.s1 <= 0) or not np.all(np.isfinite(self.losses))):
            raise ValueError(f"need s1 > 0 and finite losses but got {self.s1=}, {self.losses=}")


def curve_data(
    steps: Sequence[int], losses: Sequence[float], rates: FloatArray, decay: float = ANNEALING_DECAY
) -> CurveData:
    """A trial's evaluations (optimizer step, loss) placed on its full run's schedule `rates`.

    Raises:
        ValueError: A step outside 1..len(rates), or steps and losses of different lengths.
    """
    if len(steps) != len(losses):
        raise ValueError(
            f"steps and losses must have one length but got {len(steps)}, {len(losses)}"
        )
    index = np.asarray(steps, dtype=int) - 1
    if index.size and (index.min() < 0 or index.max() >= rates.size):
        raise ValueError(f"steps must lie in 1..{rates.size} but got {list(steps)}")
    s1, s2 = schedule_areas(rates, decay)
    at, values = s1[index], np.asarray(losses, dtype=float)
    # An evaluation before any learning-rate area (a warm-up's first step runs at rate 0) is
    # the starting loss, which the law has no S1 for: left out (the shared start covers it).
    # A curve of nothing else keeps its last point at the first area the schedule reaches.
    moved = at > 0
    if at.size and not moved.any() and np.any(s1 > 0):
        moved[-1] = True
        at = at.copy()
        at[-1] = float(s1[s1 > 0][0])
    return CurveData(
        s1=at[moved], s2=s2[index][moved], losses=values[moved],
        s1_end=float(s1[-1]), s2_end=float(s2[-1]),
    )  # fmt: skip


@dataclass(frozen=True)
class JointFit:
    """The law fitted to several trials at once.

    Every trial starts from the same base model (a LoRA adapter is a no-op at its start), so
    every curve starts at one loss and follows one shape; what differs is how fast a
    configuration moves along it per unit of S1 (its rate and batch). The law, per trial j::

        L_j(s) = L0 + D * (1 + u ** beta) ** (-alpha / beta) - C * S2_j(s),  u = S1_j(s) / tau_j

    L0 + D is the shared starting loss, beta how sharp the turn from the start's plateau
    into the power-law decay S1 ** (-alpha) of the Tissue et al. law is, tau_j trial j's
    own scale of S1 (its speed). For u >> 1 this is the paper's L0 + A * S1 ** (-alpha) -
    C * S2 with A = D * tau_j ** alpha.

    Attributes:
        shared: (L0, D, alpha, beta, C).
        log_tau: ln tau_j of each curve, in the order given.
        residual_sd: Robust sd of all residuals (loss units).
        n_points: Points the fit used.
    """

    shared: tuple[float, float, float, float, float]
    log_tau: tuple[float, ...]
    residual_sd: float
    n_points: int

    def loss(self, index: int, s1: FloatArray | float, s2: FloatArray | float) -> FloatArray:
        """Curve `index`'s law at areas (s1, s2)."""
        return _law(np.asarray(self.shared), self.log_tau[index], np.asarray(s1), np.asarray(s2))

    def predict_end(self, index: int, curve: CurveData) -> float:
        """Curve `index`'s loss at its full run's last step."""
        return float(self.loss(index, curve.s1_end, curve.s2_end))


_SHARED = 5  # L0, D, alpha, beta, C
_BETA_BOUNDS = (0.5, 6.0)
_LOG_TAU_BOUNDS = (-30.0, 30.0)


def _law(
    shared: FloatArray, log_tau: float | FloatArray, s1: FloatArray, s2: FloatArray
) -> FloatArray:
    floor, drop, alpha, beta, annealing = shared
    u = s1 * np.exp(-np.asarray(log_tau))
    # (1 + u**beta) ** (-alpha/beta) computed in logs: u**beta overflows for slow decays.
    shape = np.exp(-alpha / beta * np.logaddexp(0.0, beta * np.log(np.maximum(u, 1e-300))))
    return np.asarray(floor + drop * shape - annealing * s2, dtype=float)


def _stack(
    curves: Sequence[CurveData],
) -> tuple[FloatArray, FloatArray, FloatArray, NDArray[np.int_]]:
    s1 = np.concatenate([c.s1 for c in curves])
    s2 = np.concatenate([c.s2 for c in curves])
    y = np.concatenate([c.losses for c in curves])
    owner = np.concatenate([np.full(c.losses.size, i) for i, c in enumerate(curves)])
    return s1, s2, y, owner


def fit_joint(
    curves: Sequence[CurveData],
    *,
    f_scale: float,
    max_annealing: float,
    start: JointFit | None = None,
    max_nfev: int | None = None,
) -> JointFit:
    """Fit the law to all `curves` at once: shared L0, D, alpha, beta, C; one tau per curve.

    Bounded robust (soft-L1) least squares. L0 lies in [0, lowest loss], alpha in
    [0.05, 3], beta in [0.5, 6], C in [0, `max_annealing`] (a short trial barely sees C:
    the caller bounds it by what the study knows).

    Args:
        curves: Curves with at least one point each.
        f_scale: Residual (loss units) beyond which soft-L1 turns linear: about 2 noise sds.
        max_annealing: Upper bound of C.
        start: A previous fit of the same curves to start from, else a multi-start.
        max_nfev: Cap on the evaluations of each fit (None: scipy's default).

    Raises:
        ValueError: No curve, or a curve without points.
    """
    if not curves or any(c.losses.size == 0 for c in curves):
        raise ValueError(f"need curves with points but got {len(curves)} curves")
    s1, s2, y, owner = _stack(curves)
    n = len(curves)
    lowest, highest = max(float(np.min(y)), 1e-9), float(np.max(y))
    lower = np.r_[0.0, 0.0, _ALPHA_BOUNDS[0], _BETA_BOUNDS[0], 0.0, np.full(n, _LOG_TAU_BOUNDS[0])]
    upper = np.r_[
        lowest, 10.0 * highest + 1.0, _ALPHA_BOUNDS[1], _BETA_BOUNDS[1],
        max(max_annealing, 1e-12), np.full(n, _LOG_TAU_BOUNDS[1]),
    ]  # fmt: skip

    def fun(theta: FloatArray) -> FloatArray:
        return _law(theta[:_SHARED], theta[_SHARED:][owner], s1, s2) - y

    if start is not None:
        starts = [np.r_[start.shared, start.log_tau]]
    else:
        starts = [_start(curves, 0.5, 1.0), _start(curves, 1.0, 3.0)]
    best = None
    for theta0 in starts:
        result = least_squares(
            fun, np.clip(theta0, lower, upper), bounds=(lower, upper), loss="soft_l1",
            f_scale=f_scale, method="trf", max_nfev=max_nfev, x_scale="jac",
        )  # fmt: skip
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    theta = best.x
    return JointFit(
        shared=(float(theta[0]), float(theta[1]), float(theta[2]), float(theta[3]), float(theta[4])),
        log_tau=tuple(float(v) for v in theta[_SHARED:]),
        residual_sd=float(MAD_TO_SD * np.median(np.abs(fun(theta)))),
        n_points=int(y.size),
    )  # fmt: skip


def _start(curves: Sequence[CurveData], alpha: float, beta: float) -> FloatArray:
    """A start: the floor at half the lowest loss, the start just above the highest, each
    tau where its curve's mean loss sits on the shape."""
    y = np.concatenate([c.losses for c in curves])
    floor, top = 0.5 * float(np.min(y)), 1.02 * float(np.max(y))
    log_tau = []
    for c in curves:
        shape = np.clip((float(np.mean(c.losses)) - floor) / (top - floor), 1e-6, 1 - 1e-6)
        u = (shape ** (-beta / alpha) - 1.0) ** (1.0 / beta)  # invert the shape
        log_tau.append(math.log(float(np.exp(np.mean(np.log(c.s1))))) - math.log(max(u, 1e-12)))
    return np.r_[floor, top - floor, alpha, beta, 0.0, np.clip(log_tau, *_LOG_TAU_BOUNDS)]


def noise_sd(curves: Sequence[CurveData]) -> float:
    """One evaluation's noise, model-free: the robust sd of each inner point's distance from
    the chord through its neighbours (in log S1), pooled over the curves."""
    deviations = [chord_deviations(c.s1, c.losses) for c in curves if c.losses.size >= 3]
    if not deviations:
        return 0.0
    return float(MAD_TO_SD * np.median(np.abs(np.concatenate(deviations))))


JOINT, OWN, FALLBACK = "joint", "own", "fallback"
METHODS = (JOINT, OWN, FALLBACK)
_OWN_MIN_POINTS = 6  # a curve alone must carry the five shared parameters and its tau
_RISING_RATIO = 1.02
_NOISE_FLOOR = 1e-3  # of the loss: evaluations are never more exact than this
_ANNEALING_SEEN = 0.2  # a curve that saw this share of its run's annealing identifies C
_MAX_ANNEALING = 1.0  # C's bound once identified (loss per peak-rate step of annealing)
_BACKTEST_QUANTILE = 0.8  # the backtest's error per unit of extrapolation taken for p10/p90
_BACKTEST_MIN_CURVES = 3
# The least log sd of a prediction per unit of ln(S1 at the end / S1 at the last point).
# Measured (benchmarks/rank_fidelity.py, tiny llama, prompt/completion, trial fractions
# 0.01-0.1, 2026-11-23): the 80th percentile of |ln(full run / p50)| / distance was 0.33-0.45
# on the fresh model and 0.51-0.62 on one pre-trained for 600 steps; 0.45 x Z90 = 0.58 covers
# about 80 % of both (in-sample: the benchmark's coverage with it is not an independent test).
# A study's own backtest measures only short extrapolations (half a trial's curve to its
# end), which miss most of this error, so it can only raise it.
EXTRAPOLATION_LOG_SD = 0.45


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
        extrapolation_log_sd: The backtest's log-error sd at this extrapolation (0: none).
    """

    p10: float
    p50: float
    p90: float
    method: str
    reason: str
    n_points: int
    n_curves: int
    extrapolation_log_sd: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS} but got {self.method=}")
        if not (math.isfinite(self.p90) and 0 <= self.p10 <= self.p50 <= self.p90):
            raise ValueError(
                f"need 0 <= p10 <= p50 <= p90 but got {self.p10=}, {self.p50=}, {self.p90=}"
            )


def predict_final(
    target: CurveData, peers: Sequence[CurveData], *, bootstrap: int = 8, seed: int = 0
) -> LawPrediction:
    """Predict `target`'s loss at its full run's end from its curve and its peers' curves.

    Rules, in order: a curve whose last two losses both rose 2 % above its minimum falls
    back (no decay to extrapolate); with no peer, a curve of fewer than 6 points falls back
    (nothing shows the shape); else the law is fitted to all curves (`fit_joint`; C is fitted
    only when some curve saw at least 20 % of its run's annealing, else held at 0) and p50
    is its value at the end. The band adds in quadrature, in log space: the spread of
    `bootstrap` refits on resampled peers (their disagreement), the extrapolation's error
    (log sd per unit of ln(S1 end / S1 last): the larger of `backtest_log_sd` and
    `EXTRAPOLATION_LOG_SD`, times that distance) and one evaluation's noise.

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
    fit, noise, max_annealing = fit_shared(curves)
    p50 = fit.predict_end(len(curves) - 1, target)
    if not (math.isfinite(p50) and p50 > 0):
        return _fallback(target, peers, f"the law gives {p50:.4g} at the run's end")
    spread = _bootstrap_log_spread(curves, fit, max_annealing, noise, bootstrap, seed)
    per_unit = max(backtest_log_sd(curves, max_annealing, noise), EXTRAPOLATION_LOG_SD)
    extrapolation = per_unit * _distance(target)
    half = Z90 * math.sqrt(spread**2 + extrapolation**2 + (noise / p50) ** 2)
    return LawPrediction(
        p10=p50 * math.exp(-half), p50=p50, p90=p50 * math.exp(half),
        method=JOINT if peers else OWN, reason="", n_points=n, n_curves=len(curves),
        extrapolation_log_sd=extrapolation,
    )  # fmt: skip


def fit_shared(curves: Sequence[CurveData]) -> tuple[JointFit, float, float]:
    """The law fitted jointly to `curves` (the last one's level sets the noise floor).

    C is fitted (bounded by 1 loss unit per peak-rate step of annealing) only when some
    curve saw at least 20 % of its run's annealing, else held at 0: a curve that ran through
    a decay of its own (the study's reference run, a full run that reported back) is what
    identifies it.

    Returns:
        The fit, one evaluation's noise it assumed, and C's upper bound.
    """
    noise = max(noise_sd(curves), _NOISE_FLOOR * float(np.median(curves[-1].losses)))
    max_annealing = _MAX_ANNEALING if _annealing_seen(curves) else 0.0
    return fit_joint(curves, f_scale=2.0 * noise, max_annealing=max_annealing), noise, max_annealing


def _annealing_seen(curves: Sequence[CurveData]) -> bool:
    return any(c.s2_end > 0 and float(c.s2[-1]) >= _ANNEALING_SEEN * c.s2_end for c in curves)


def _distance(curve: CurveData) -> float:
    """How far a prediction extrapolates: ln(S1 at the end / S1 at the last point)."""
    return max(math.log(curve.s1_end / float(curve.s1[-1])), 0.0)


def _bootstrap_log_spread(
    curves: Sequence[CurveData], fit: JointFit, max_annealing: float, noise: float,
    resamples: int, seed: int,
) -> float:  # fmt: skip
    """Half the p10-p90 range / Z90 of ln(prediction) over refits on resampled peers (the
    target, last, is always in): how much the trials disagree about the shared shape."""
    if resamples <= 0 or len(curves) < 3:
        return 0.0
    rng = np.random.default_rng(seed)
    target = curves[-1]
    values = []
    for _ in range(resamples):
        picks = rng.integers(0, len(curves) - 1, size=len(curves) - 1)
        sample = [curves[i] for i in picks] + [target]
        start = JointFit(
            fit.shared, tuple(fit.log_tau[i] for i in picks) + (fit.log_tau[-1],), 0, 0
        )
        refit = fit_joint(
            sample, f_scale=2.0 * noise, max_annealing=max_annealing, start=start, max_nfev=20
        )
        value = refit.predict_end(len(sample) - 1, target)
        if math.isfinite(value) and value > 0:
            values.append(math.log(value))
    if len(values) < 3:
        return 0.0
    q10, q90 = np.quantile(values, [0.1, 0.9])
    return float(q90 - q10) / (2 * Z90)


def backtest_log_sd(curves: Sequence[CurveData], max_annealing: float, noise: float) -> float:
    """The law's log error per unit of extrapolation distance, measured on the study's curves.

    Every curve of at least 3 points is cut to its first half, the cut curves (and the
    shorter ones whole) are fitted jointly, and each cut curve's last observed loss is
    predicted; |ln(observed / predicted)| / ln(S1 last / S1 at the cut) over the cut curves,
    its 80th percentile / Z90, is the log sd per unit of ln S1 ratio. 0 with fewer than 3 cut
    curves (nothing measured: the band then rests on the bootstrap and the noise).
    """
    cut, checks = [], []
    for c in curves:
        keep = c.losses.size // 2
        if c.losses.size >= 3 and c.s1[-1] > c.s1[keep - 1]:
            cut.append(CurveData(c.s1[:keep], c.s2[:keep], c.losses[:keep], c.s1_end, c.s2_end))
            checks.append((len(cut) - 1, c))
        else:
            cut.append(c)
    if len(checks) < _BACKTEST_MIN_CURVES:
        return 0.0
    fit = fit_joint(cut, f_scale=2.0 * noise, max_annealing=max_annealing, max_nfev=200)
    ratios = []
    for index, c in checks:
        predicted = float(fit.loss(index, c.s1[-1], c.s2[-1]))
        distance = math.log(float(c.s1[-1]) / float(cut[index].s1[-1]))
        if predicted > 0 and distance > 0:
            ratios.append(abs(math.log(float(c.losses[-1]) / predicted)) / distance)
    if len(ratios) < _BACKTEST_MIN_CURVES:
        return 0.0
    return float(np.quantile(ratios, _BACKTEST_QUANTILE)) / Z90


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
    half = Z90 * EXTRAPOLATION_LOG_SD * _distance(target)
    if len(peers) >= 2:
        noise = max(noise_sd(peers), _NOISE_FLOOR * last)
        fit = fit_joint(peers, f_scale=2.0 * noise, max_annealing=0.0)
        ratios = [fit.predict_end(i, p) / float(p.losses[-1]) for i, p in enumerate(peers)]
        q10, q50, q90 = (float(q) for q in np.quantile(ratios, [0.1, 0.5, 0.9]))
        p50 = last * q50
        p10 = min(last * q10, p50 * math.exp(-half))
        p90 = max(last * q90, last, p50 * math.exp(half))
        return LawPrediction(max(p10, 0.0), p50, p90, FALLBACK, reason, n, len(peers))
    return LawPrediction(last * math.exp(-half), last, last, FALLBACK, reason, n, 0)
