"""The loss of a run as a function of its learning-rate schedule, fitted across a study.

Tissue et al., "Scaling Law with Learning Rate Annealing" (NeurIPS 2025, arXiv 2408.11029)::

    L(s) = L0 + A * S1(s) ** (-alpha) - C * S2(s)

S1(s) is the forward area up to optimizer step s: in the paper the area under the
learning-rate curve; here the sum of eta_i ** `analysis.curves.lr_schedule.FORWARD_POWER` (0.5),
because in fine-tuning runs a step at a lower rate moves the loss nearly as far as one at the
peak (measured there). S2(s) is the annealing area: a momentum-weighted sum of the rate's
drops, m_i = decay * m_(i-1) + (eta_(i-1) - eta_i), S2(s) = sum of m_i up to s. Both are in
units of the run's peak rate (a step at the peak rate adds 1 to S1), so A absorbs how fast a
configuration learns per step and C is the loss one unit of annealing removes.

A trial is the start of its full run: it knows the full run's whole schedule (warm-up,
decay, step count) from `analysis.curves.lr_schedule.learning_rates`, which reproduces transformers' schedulers, so
the law predicts the loss at the full run's last step with its decay included.

The study's trials share the model and the data, so the exponent, the annealing
coefficient and the loss floor L0 are shared: `fit_joint` fits all trials at once, each
keeping its own amplitude A. A 6-point curve then borrows the shape the other trials
show. `analysis.curves.law_prediction` turns the fit into a trial's prediction and its band.

Pure numpy/scipy: imports nothing from the project but `analysis.curves.noise` and
`analysis.curves.lr_schedule`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

from analysis.curves.lr_schedule import ANNEALING_DECAY, schedule_areas
from analysis.curves.noise import MAD_TO_SD, chord_deviations

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
        return self.loss_at(self.log_tau[index], s1, s2)

    def loss_at(self, log_tau: float, s1: FloatArray | float, s2: FloatArray | float) -> FloatArray:
        """The law of a curve of speed `log_tau` (ln tau) at areas (s1, s2)."""
        return _law(np.asarray(self.shared), log_tau, np.asarray(s1), np.asarray(s2))

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

    def jac(theta: FloatArray) -> FloatArray:
        return law_jacobian(theta, owner, s1, s2)

    if start is not None:
        starts = [np.r_[start.shared, start.log_tau]]
    else:
        starts = [_start(curves, 0.5, 1.0), _start(curves, 1.0, 3.0)]
    best = None
    for theta0 in starts:
        result = least_squares(
            fun, np.clip(theta0, lower, upper), bounds=(lower, upper), loss="soft_l1",
            f_scale=f_scale, method="trf", max_nfev=max_nfev, x_scale="jac", jac=jac,
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


def law_jacobian(
    theta: FloatArray, owner: NDArray[np.int_], s1: FloatArray, s2: FloatArray
) -> FloatArray:
    """d(law)/d(theta) at every point: the shared (L0, D, alpha, beta, C), then one ln tau
    per curve (`owner[k]`: point k's curve). Analytic: a finite-difference Jacobian costs
    one evaluation per parameter, and each curve adds one."""
    _, drop, alpha, beta, _ = theta[:_SHARED]
    log_u = np.log(np.maximum(s1, 1e-300)) - theta[_SHARED:][owner]
    g = np.logaddexp(0.0, beta * log_u)  # ln(1 + u**beta)
    shape = np.exp(-alpha / beta * g)
    sigma = np.exp(beta * log_u - g)  # u**beta / (1 + u**beta)
    out = np.zeros((s1.size, theta.size))
    out[:, 0] = 1.0
    out[:, 1] = shape
    out[:, 2] = -drop * shape * g / beta
    out[:, 3] = drop * shape * alpha * (g / beta**2 - sigma * log_u / beta)
    out[:, 4] = -s2
    out[np.arange(s1.size), _SHARED + owner] = drop * alpha * sigma * shape
    return out


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


def warm_start(
    curves: Sequence[CurveData], shared: Sequence[float], log_tau: Sequence[float | None]
) -> JointFit:
    """A start for `fit_joint` from an earlier fit's shared parameters: each curve keeps its
    `log_tau` where one is known, else where its mean loss sits on that fit's shape.

    Raises:
        ValueError: `shared` is not 5 values, or `log_tau` not one per curve.
    """
    if len(shared) != _SHARED or len(log_tau) != len(curves):
        raise ValueError(
            f"need 5 shared values and one log_tau per curve but got {len(shared)=}, "
            f"{len(log_tau)=} for {len(curves)} curves"
        )
    floor, drop, alpha, beta, annealing = (float(v) for v in shared)
    taus = []
    for c, known in zip(curves, log_tau, strict=True):
        if known is not None and math.isfinite(known):
            taus.append(float(known))
            continue
        level = float(np.mean(c.losses)) - floor + annealing * float(np.mean(c.s2))
        shape = min(max(level / max(drop, 1e-12), 1e-6), 1 - 1e-6)
        u = (shape ** (-beta / alpha) - 1.0) ** (1.0 / beta)  # invert the shape
        taus.append(float(np.mean(np.log(c.s1))) - math.log(max(u, 1e-12)))
    clipped = np.clip(taus, *_LOG_TAU_BOUNDS)
    return JointFit((floor, drop, alpha, beta, annealing), tuple(float(v) for v in clipped), 0.0, 0)
