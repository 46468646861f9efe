"""Predict the final validation loss of a full run from the start of its learning curve.

A trial is the literal start of its full run (same schedule, same data order), so its
validation losses are the first points of the full run's curve. We extrapolate them with
a saturating power law in training progress x (tokens seen, or learning-rate-weighted
tokens; the caller chooses)::

    L(x) = a + b * (x / x0) ** (-c)

`a` is the loss the run approaches, `b` the excess over it at `x0` (the first observed x,
fixed so the parameters are well conditioned) and `c` how fast the excess decays. This is
the Chinchilla form L = E + B / D**beta (Hoffmann et al. 2022, "Training Compute-Optimal
Large Language Models") in the data term, and the "pow3" family among the parametric
curves Domhan et al. (IJCAI 2015, "Speeding up automatic hyperparameter optimization of
deep neural networks by extrapolation of learning curves") combine to extrapolate learning
curves. The fit is robust nonlinear least squares; the interval is a residual bootstrap of
the fit at the target plus the noise of one evaluation.

A short curve does not always support three parameters, so `fit_curve` falls back to a
plain level with a wide band, and says why, when the curve has too few points, is flat
within its noise, is rising (overfitting or divergence: no decay to extrapolate), or when
the power law does not describe it. Only malformed input raises: otherwise the study
always gets a finite, ordered p10 <= p50 <= p90.

What the trial's curve cannot show is the end of the full run's schedule: the learning
rate's decay in the last part of a run lowers the loss below any extrapolation of its
start. That systematic gap is not modelled here; `LossCorrection`, fitted from full runs'
measured final losses against their trials' predictions, absorbs it (and any other bias of
the extrapolation) as one multiplicative factor with its own spread.

Pure numpy/scipy: imports nothing from the project.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares
from scipy.stats import t as student_t

FloatArray = NDArray[np.float64]

POWER_LAW = "power_law"
# How `analysis.loss_law` made a prediction it records as a CurveFit (see there).
LAW_METHODS = ("joint", "own")
FITTED = (POWER_LAW, *LAW_METHODS)
FALLBACKS = ("too_few_points", "flat", "rising", "poor_fit", "fallback")
CORRECTION_VERSION = 1
Z90 = 1.2815515655446004  # standard normal quantile of 0.9
_MAD_TO_SD = 1.482602218505602  # robust sd = this x median absolute deviation (normal data)
_N_PARAMETERS = 3
_C_BOUNDS = (0.02, 3.0)
_START_EXPONENTS = (0.1, 0.3, 0.7, 1.5)
_F_SCALE_NOISE = 2.0  # soft_l1 turns linear beyond this many noise sds
_FLAT_NOISE = 2.0  # improvement below this many noise sds: flat
_RISING_NOISE = 2.0  # last loss above the minimum by this many noise sds ...
_RISING_RATIO = 1.02  # ... and by this factor: rising
_POOR_FIT_NOISE = 3.0  # residual sd above this many noise sds ...
_POOR_FIT_RELATIVE = 0.002  # ... and above this fraction of the loss: poor fit
_FLAT_TAIL = 3  # points averaged for the flat level
_TOO_FEW_BAND = 0.05  # half-width floors of the fallback bands, as fractions of p50
_FLAT_BAND = 0.01
_POOR_FIT_BAND = 0.05
# Refits of an ill-identified curve (asymptote and exponent trading off) crawl along a
# flat valley; the cap bounds their time, and a capped refit still counts where it got to.
_BOOTSTRAP_MAX_NFEV = 50


def power_law(x: ArrayLike, a: float, b: float, c: float, x0: float) -> FloatArray:
    """Evaluate the saturating power law L(x) = a + b * (x / x0) ** (-c).

    Args:
        x: Training progress (same unit as `x0`), positive.
        a: Asymptotic loss.
        b: Excess loss over `a` at `x0`.
        c: Decay exponent.
        x0: Fixed scale of x (the fit uses the first observed x).

    Returns:
        The loss at each x, as a float array of x's shape.
    """
    t = np.asarray(x, dtype=float) / x0
    return np.asarray(a + b * t ** (-c), dtype=float)


def _sig6(value: float) -> float:
    return float(f"{value:.6g}")


def _check_keys(cls: type, data: Mapping[str, object]) -> None:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no fields {unknown}")
    missing = sorted(names - set(data))
    if missing:
        raise ValueError(f"{cls.__name__} is missing fields {missing}")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number but got {value=}")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer but got {value=}")
    return value


@dataclass(frozen=True)
class CurveFit:
    """A learning curve's fit and its prediction of the loss at `target`.

    Attributes:
        method: "power_law", or the fallback used: "too_few_points", "flat", "rising",
            "poor_fit"; for a prediction of `analysis.loss_law`, "joint", "own" or
            "fallback" (its curve parameters are then the constant p50).
        reason: Why the fallback was used, in one line ("" for a fitted method).
        a: Asymptotic loss of the power law; for a fallback, its constant level.
        b: Excess loss over `a` at `x0` (0 for a fallback).
        c: Decay exponent (0 for a fallback).
        x0: Scale of x: the first observed x.
        target: The x the prediction is for (the full run's end).
        p10: 10th percentile of the predicted loss at `target`.
        p50: Median predicted loss at `target`.
        p90: 90th percentile of the predicted loss at `target`.
        n_points: Observed points the fit used.
        residual_sd: Robust sd of the fit's residuals (loss units): the noise of one
            evaluation (for a fallback, the noise estimated from the curve itself).
        last_loss: The last observed loss.
    """

    method: str
    reason: str
    a: float
    b: float
    c: float
    x0: float
    target: float
    p10: float
    p50: float
    p90: float
    n_points: int
    residual_sd: float
    last_loss: float

    def __post_init__(self) -> None:
        if self.method not in FITTED and self.method not in FALLBACKS:
            raise ValueError(
                f"method must be one of {FITTED} or {FALLBACKS} but got {self.method=}"
            )
        if (self.method in FITTED) != (self.reason == ""):
            raise ValueError(
                f"reason must be empty exactly when method is one of {FITTED} but got "
                f"{self.reason=}"
            )
        for name in ("a", "b", "c", "p10", "p50", "p90", "residual_sd", "last_loss"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite but got {value=}")
        for name in ("x0", "target"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number but got {value=}")
        if not self.p10 <= self.p50 <= self.p90:
            raise ValueError(
                f"need p10 <= p50 <= p90 but got {self.p10=}, {self.p50=}, {self.p90=}"
            )
        if self.n_points < 0:
            raise ValueError(f"n_points must be >= 0 but got {self.n_points=}")
        if self.residual_sd < 0:
            raise ValueError(f"residual_sd must be >= 0 but got {self.residual_sd=}")

    @property
    def fell_back(self) -> bool:
        """Whether the prediction comes from a fallback rather than a fitted law."""
        return self.method not in FITTED

    @overload
    def predict(self, x: float) -> float: ...

    @overload
    def predict(self, x: NDArray[Any]) -> FloatArray: ...

    def predict(self, x: float | NDArray[Any]) -> float | FloatArray:
        """Evaluate the fitted curve (a constant `a` for a fallback).

        Args:
            x: Training progress, positive; a number or an array.

        Returns:
            The loss: a float for a number, an array of x's shape for an array.
        """
        values = power_law(x, self.a, self.b, self.c, self.x0)
        return float(values) if np.ndim(x) == 0 else values

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict; floats rounded to 6 significant digits."""
        return {
            name: _sig6(value) if isinstance(value, float) else value
            for name, value in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CurveFit:
        """Build from `to_dict` output.

        Raises:
            ValueError: A field is unknown, missing or of the wrong type, or the values
                are inconsistent.
        """
        _check_keys(cls, data)
        for name in ("method", "reason"):
            if not isinstance(data[name], str):
                raise ValueError(f"{name} must be a string but got {data[name]=}")
        floats = {
            f.name: _number(f.name, data[f.name])
            for f in fields(cls)
            if f.name not in ("method", "reason", "n_points")
        }
        return cls(
            method=str(data["method"]),
            reason=str(data["reason"]),
            n_points=_integer("n_points", data["n_points"]),
            **floats,
        )


def _check_inputs(x: FloatArray, losses: FloatArray, target: float) -> None:
    if x.ndim != 1 or losses.ndim != 1:
        raise ValueError(f"x and losses must be 1-D but got {x.shape=}, {losses.shape=}")
    if x.size != losses.size:
        raise ValueError(
            f"x and losses must have the same length but got {x.size=}, {losses.size=}"
        )
    if x.size == 0:
        raise ValueError(f"x must hold at least one point but got {x.size=}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"x must be finite and > 0 but got {x=}")
    if np.any(np.diff(x) <= 0):
        raise ValueError(f"x must be strictly increasing but got {x=}")
    if not np.all(np.isfinite(losses)) or np.any(losses < 0):
        raise ValueError(f"losses must be finite and >= 0 but got {losses=}")
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target must be a positive number but got {target=}")


def _chord_deviations(x: FloatArray, losses: FloatArray) -> FloatArray:
    """How far each inner point sits from the chord through its two neighbours.

    The chord is drawn in log x, where a power law is nearly straight, so the curve's own
    bend adds little; each deviation is scaled to the sd of one evaluation.
    """
    u = np.log(x)
    w = (u[2:] - u[1:-1]) / (u[2:] - u[:-2])
    chord = w * losses[:-2] + (1.0 - w) * losses[2:]
    return np.asarray((losses[1:-1] - chord) / np.sqrt(1.0 + w**2 + (1.0 - w) ** 2), dtype=float)


@dataclass(frozen=True)
class _Curve:
    """The validated observations and what every fallback records of them."""

    x: FloatArray
    losses: FloatArray
    target: float
    noise: float

    def fallback(self, method: str, reason: str, p10: float, p50: float, p90: float) -> CurveFit:
        return CurveFit(
            method=method,
            reason=reason,
            a=p50,
            b=0.0,
            c=0.0,
            x0=float(self.x[0]),
            target=self.target,
            p10=max(p10, 0.0),
            p50=p50,
            p90=p90,
            n_points=int(self.losses.size),
            residual_sd=self.noise,
            last_loss=float(self.losses[-1]),
        )


def _too_few(curve: _Curve, min_points: int) -> CurveFit:
    tail = curve.losses[-2:]
    level = float(np.mean(tail))
    half_width = max(float(np.ptp(tail)), _TOO_FEW_BAND * level)
    reason = f"{curve.losses.size} points, fewer than the {min_points} a power-law fit needs"
    return curve.fallback("too_few_points", reason, level - half_width, level, level + half_width)


def _flat(curve: _Curve, reason: str) -> CurveFit:
    tail = curve.losses[-_FLAT_TAIL:]
    level = float(np.mean(tail))
    sd = max(float(np.std(tail, ddof=1)), curve.noise, _FLAT_BAND * level)
    return curve.fallback("flat", reason, level - Z90 * sd, level, level + Z90 * sd)


def _poor_fit(curve: _Curve, reason: str, residual_sd: float) -> CurveFit:
    last = float(curve.losses[-1])
    half_width = max(2 * Z90 * max(residual_sd, curve.noise), _POOR_FIT_BAND * last)
    return curve.fallback("poor_fit", reason, last - half_width, last, last + half_width)


def _residuals(theta: FloatArray, t: FloatArray, y: FloatArray) -> FloatArray:
    a, b, c = theta
    return np.asarray(a + b * t ** (-c) - y, dtype=float)


def _jacobian(theta: FloatArray, t: FloatArray, y: FloatArray) -> FloatArray:
    _, b, c = theta
    decay = t ** (-c)
    return np.column_stack([np.ones_like(t), decay, -b * decay * np.log(t)])


def _fit_once(
    start: FloatArray, t: FloatArray, y: FloatArray, f_scale: float, max_nfev: int | None
) -> Any:
    """One bounded robust fit of (a, b, c) to losses `y` at relative progress `t`."""
    # The asymptote cannot lie above the lowest loss already observed.
    lower = [0.0, 0.0, _C_BOUNDS[0]]
    upper = [max(float(np.min(y)), 1e-12), np.inf, _C_BOUNDS[1]]
    return least_squares(
        _residuals, np.clip(start, lower, upper), jac=_jacobian, bounds=(lower, upper),
        loss="soft_l1", f_scale=f_scale, args=(t, y), max_nfev=max_nfev, method="trf",
    )  # fmt: skip


def _best_fit(t: FloatArray, y: FloatArray, f_scale: float) -> Any:
    """Multi-start fit: for each start exponent, `a` and `b` by linear least squares."""
    results = []
    for c in _START_EXPONENTS:
        design = np.column_stack([np.ones_like(t), t ** (-c)])
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        start = np.array([a, max(b, 1e-6), c], dtype=float)
        results.append(_fit_once(start, t, y, f_scale, None))
    return min(results, key=lambda result: float(result.cost))


def _bootstrap_spread(
    theta: FloatArray,
    t: FloatArray,
    residuals: FloatArray,
    y: FloatArray,
    t_target: float,
    *,
    f_scale: float,
    resamples: int,
    seed: int,
) -> tuple[float, float]:
    """10th and 90th percentiles of refitted predictions at `t_target`, residuals resampled.

    Residuals are centred and scaled up for the parameters the fit spent; every refit starts
    at the point fit (no multi-start), and all of them run at once (`_refit_all`).
    """
    rng = np.random.default_rng(seed)
    fitted = y - residuals
    centred = (residuals - np.median(residuals)) * math.sqrt(y.size / (y.size - _N_PARAMETERS))
    y_star = fitted + rng.choice(centred, size=(resamples, y.size), replace=True)
    a, b, c = _refit_all(theta, t, y_star, f_scale, _BOOTSTRAP_MAX_NFEV).T
    q10, q90 = np.quantile(a + b * t_target ** (-c), [0.1, 0.9])
    return float(q10), float(q90)


def _refit_all(
    start: FloatArray, t: FloatArray, y: FloatArray, f_scale: float, iterations: int
) -> FloatArray:
    """The fit of `_fit_once` for every row of `y` at once: (a, b, c) per row.

    The same objective (soft-L1 loss, the same bounds, the asymptote below each row's lowest
    loss), minimised by Levenberg-Marquardt steps projected onto the bounds, with the soft-L1
    loss as iteratively reweighted least squares. One refit at a time through scipy took
    ~5 ms each, 1 s per trial for 200 refits; together they take ~10 ms and agree with it to
    the fourth decimal on the predictions.
    """
    rows = y.shape[0]
    lower = np.array([0.0, 0.0, _C_BOUNDS[0]])
    upper = np.column_stack(
        [np.maximum(y.min(axis=1), 1e-12), np.full(rows, np.inf), np.full(rows, _C_BOUNDS[1])]
    )
    theta = np.clip(np.tile(start, (rows, 1)), lower, upper)
    log_t = np.log(t)

    def residuals_and_cost(th: FloatArray) -> tuple[FloatArray, FloatArray]:
        r = th[:, :1] + th[:, 1:2] * t ** (-th[:, 2:3]) - y
        return r, (2.0 * (np.sqrt(1.0 + (r / f_scale) ** 2) - 1.0)).sum(axis=1)

    r, cost = residuals_and_cost(theta)
    damping = np.full(rows, 1e-3)
    eye = np.eye(_N_PARAMETERS)
    for _ in range(iterations):
        decay = t ** (-theta[:, 2:3])
        jac = np.stack([np.ones_like(decay), decay, -theta[:, 1:2] * decay * log_t], axis=2)
        weighted = jac * (1.0 / np.sqrt(1.0 + (r / f_scale) ** 2))[:, :, None]
        normal = np.einsum("rni,rnj->rij", weighted, jac)
        gradient = np.einsum("rni,rn->ri", weighted, r)
        scale = np.maximum(np.einsum("rii->ri", normal), 1e-12) * damping[:, None]
        step = np.linalg.solve(normal + scale[:, :, None] * eye, -gradient[:, :, None])[:, :, 0]
        candidate = np.clip(theta + step, lower, upper)
        r_new, cost_new = residuals_and_cost(candidate)
        better = cost_new < cost
        theta = np.where(better[:, None], candidate, theta)
        r = np.where(better[:, None], r_new, r)
        cost = np.where(better, cost_new, cost)
        damping = np.where(better, damping / 3.0, damping * 4.0)
    return np.asarray(theta, dtype=float)


def fit_curve(
    x: ArrayLike,
    losses: ArrayLike,
    target: float,
    *,
    min_points: int = 4,
    bootstrap: int = 200,
    seed: int = 0,
) -> CurveFit:
    """Fit a power law to a trial's validation losses and predict the loss at `target`.

    Fallback rules, checked in this order ("noise" is the robust sd of each point's distance
    from the chord through its neighbours, a model-free estimate of one evaluation's noise):

    - too_few_points: fewer than `min_points` points. p50 = mean of the last two losses
      (the last one alone if there is one), band +- max(their range, 5 %).
    - rising: both of the last two losses exceed the minimum by 2 noise sds and by 2 %.
      p50 = last loss, p10 = minimum, p90 = last + (last - minimum).
    - flat: the mean of the first two losses beats that of the last two by less than 2 noise
      sds, or the fitted decay over the observed range is that small. p50 = mean of the last
      three losses, band +- 1.28 x max(their sd, noise, 1 %).
    - poor_fit: the fit failed, or the root-mean-square residual (scaled for the three
      parameters) exceeds 3 x the root-mean-square chord distance and 0.2 % of the loss.
      p50 = last loss, band +- max(2.56 x max(residual sd, noise), 5 %).

    Otherwise the power law's value at `target` is p50, and p10/p90 add, in quadrature, the
    spread of `bootstrap` refits to resampled residuals and one evaluation's noise
    (`residual_sd`), both widened by Student's t over the normal quantile for the few
    points. The band widens as `target` moves beyond the data; at or before the last
    observed x it is mostly `residual_sd`. A fallback's p10 is clipped at 0.

    Args:
        x: Training progress at each evaluation, > 0 and strictly increasing.
        losses: Validation loss at each evaluation: finite and >= 0. A NaN/inf loss means
            the run diverged, which the caller must handle, so it raises rather than being
            silently dropped.
        target: Progress at the end of the full run (may lie inside the observed range).
        min_points: Fewest points for a power-law fit (>= 4: three parameters and one
            degree of freedom).
        bootstrap: Residual-bootstrap refits for the interval (0: band from `residual_sd`
            alone).
        seed: Seed of the bootstrap's random generator: a fixed seed gives the same fit.

    Returns:
        The fit; `method` says whether the power law or a fallback made the prediction.

    Raises:
        ValueError: An argument is malformed (the message names it and its value).
    """
    x_arr = np.asarray(x, dtype=float)
    y = np.asarray(losses, dtype=float)
    target = float(target)
    _check_inputs(x_arr, y, target)
    if isinstance(min_points, bool) or not isinstance(min_points, int) or min_points < 4:
        raise ValueError(f"min_points must be an integer >= 4 but got {min_points=}")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise ValueError(f"bootstrap must be an integer >= 0 but got {bootstrap=}")
    if y.size < min_points:
        return _too_few(_Curve(x_arr, y, target, float(np.std(y[-2:]))), min_points)

    deviations = _chord_deviations(x_arr, y)
    noise = max(float(_MAD_TO_SD * np.median(np.abs(deviations))), 1e-9 * float(np.max(y)), 1e-12)
    curve = _Curve(x_arr, y, target, noise)
    last, lowest = float(y[-1]), float(np.min(y))
    # Both of the last two points must have risen: one high point is too often just noise.
    risen = float(np.min(y[-2:]))
    if risen > lowest + _RISING_NOISE * noise and risen > _RISING_RATIO * lowest:
        reason = f"loss rose from its minimum {lowest:.4g} to {last:.4g}: no decay to extrapolate"
        return curve.fallback("rising", reason, lowest, last, 2 * last - lowest)
    improvement = float(np.mean(y[:2]) - np.mean(y[-2:]))
    if improvement < _FLAT_NOISE * noise:
        return _flat(curve, f"loss improved by {improvement:.3g}, within its noise {noise:.3g}")

    x0 = float(x_arr[0])
    t = x_arr / x0
    f_scale = _F_SCALE_NOISE * noise
    best = _best_fit(t, y, f_scale)
    theta = np.asarray(best.x, dtype=float)
    a, b, c = (float(v) for v in theta)
    residuals = y - power_law(x_arr, a, b, c, x0)
    dof_factor = math.sqrt(y.size / (y.size - _N_PARAMETERS))
    residual_sd = float(_MAD_TO_SD * np.median(np.abs(residuals))) * dof_factor
    fitted_drop = b * (1.0 - float(t[-1]) ** (-c))
    if fitted_drop < _FLAT_NOISE * noise:
        return _flat(curve, f"the fitted decay {fitted_drop:.3g} is within the noise {noise:.3g}")
    # A ratio of two noisy sd estimates: the efficient (root-mean-square) ones keep chance
    # ratios above 3 rare with ~10 points, while a curve the law cannot bend to exceeds it.
    misfit_rms = float(np.sqrt(np.mean(residuals**2))) * dof_factor
    noise_rms = float(np.sqrt(np.mean(deviations**2)))
    if not best.success or misfit_rms > max(_POOR_FIT_NOISE * noise_rms, _POOR_FIT_RELATIVE * last):
        reason = (
            f"the power law misses the curve: residual rms {misfit_rms:.3g}, noise {noise_rms:.3g}"
        )
        return _poor_fit(curve, reason, residual_sd)

    p50 = float(power_law(target, a, b, c, x0))
    low = high = 0.0
    if bootstrap > 0:
        q10, q90 = _bootstrap_spread(
            theta, t, residuals, y, target / x0, f_scale=f_scale, resamples=bootstrap, seed=seed
        )
        low, high = max(p50 - q10, 0.0), max(q90 - p50, 0.0)
    # Both spreads come from n residuals standing in for the noise's unknown sd: widen them
    # by Student's t over the normal quantile, as a t interval would (x1.10 at 10 points).
    widen = float(student_t.ppf(0.9, y.size - _N_PARAMETERS)) / Z90
    noise_term = Z90 * residual_sd
    p10 = max(p50 - widen * math.hypot(low, noise_term), 0.0)
    p90 = p50 + widen * math.hypot(high, noise_term)
    if not all(math.isfinite(v) for v in (p10, p50, p90)):
        return _poor_fit(curve, f"the power law overflows at target {target:.4g}", residual_sd)
    return CurveFit(
        method=POWER_LAW,
        reason="",
        a=a,
        b=b,
        c=c,
        x0=x0,
        target=target,
        p10=p10,
        p50=p50,
        p90=p90,
        n_points=int(y.size),
        residual_sd=residual_sd,
        last_loss=last,
    )


@dataclass(frozen=True)
class LossCorrection:
    """Accuracy calibration of predicted final losses, fitted from full runs.

    Extrapolating a trial's curve misses what happens late in the full run (the learning
    rate's decay lowers the loss; a longer run may start to overfit). Full runs report their
    measured final loss; the ratio measured / predicted p50 over those runs gives one
    multiplicative correction and its spread.

    Attributes:
        scale: Factor on predicted losses: the median ratio measured / predicted, shrunk
            toward 1 (see `fit_loss_correction`).
        log_sd: Robust sd of log(measured / predicted) over the runs (0 with fewer than 2).
        n_runs: Full runs the correction was fitted from.
        version: Format version of the stored correction.
    """

    scale: float = 1.0
    log_sd: float = 0.0
    n_runs: int = 0
    version: int = CORRECTION_VERSION

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive number but got {self.scale=}")
        if not (math.isfinite(self.log_sd) and self.log_sd >= 0):
            raise ValueError(f"log_sd must be a number >= 0 but got {self.log_sd=}")
        if self.n_runs < 0:
            raise ValueError(f"n_runs must be >= 0 but got {self.n_runs=}")
        if self.version != CORRECTION_VERSION:
            raise ValueError(f"version must be {CORRECTION_VERSION} but got {self.version=}")

    def apply(self, fit: CurveFit) -> CurveFit:
        """Return `fit` with its prediction corrected; method, reason and curve unchanged.

        p10/p50/p90 are multiplied by `scale`; each half of the band, in log space, gets
        1.28 x `log_sd` added in quadrature. `a`, `b`, `c` still describe the trial's
        observed losses (so `predict` matches them), not the corrected prediction. Apply a
        correction once: a corrected fit does not record that it was corrected.
        """
        p50 = self.scale * fit.p50
        extra = Z90 * self.log_sd
        p10 = (
            p50 * math.exp(-math.hypot(math.log(fit.p50 / fit.p10), extra)) if fit.p10 > 0 else 0.0
        )
        if fit.p50 > 0:
            p90 = p50 * math.exp(math.hypot(math.log(fit.p90 / fit.p50), extra))
        else:
            p90 = self.scale * fit.p90
        return replace(fit, p10=min(p10, p50), p50=p50, p90=max(p90, p50))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict; floats rounded to 6 significant digits."""
        return {
            name: _sig6(value) if isinstance(value, float) else value
            for name, value in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> LossCorrection:
        """Build from `to_dict` output.

        Raises:
            ValueError: A field is unknown, missing or of the wrong type, or a value is bad.
        """
        _check_keys(cls, data)
        return cls(
            scale=_number("scale", data["scale"]),
            log_sd=_number("log_sd", data["log_sd"]),
            n_runs=_integer("n_runs", data["n_runs"]),
            version=_integer("version", data["version"]),
        )


def fit_loss_correction(pairs: Sequence[tuple[float, float]]) -> LossCorrection:
    """Fit the loss correction from full runs.

    Rule: with r_i = log(measured_i / predicted_i) over n runs,
    scale = exp(n / (n + 1) x median(r)): the median ratio, shrunk geometrically toward 1
    as if one more run had measured exactly its prediction. One run moves predictions
    half-way (in log space) to what it measured; ten runs 91 %.
    log_sd = 1.4826 x median(|r - median(r)|) (0 with fewer than two runs).

    Args:
        pairs: (predicted p50, measured final loss) of each full run; both finite and > 0.

    Returns:
        The correction; the identity (scale 1, log_sd 0) when `pairs` is empty.

    Raises:
        ValueError: A pair is malformed or holds a non-positive or non-finite loss.
    """
    ratios = []
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise ValueError(f"pairs[{i}] must be (predicted, measured) but got {pair=}")
        predicted, measured = float(pair[0]), float(pair[1])
        if not all(math.isfinite(v) and v > 0 for v in (predicted, measured)):
            raise ValueError(f"pairs[{i}] must hold finite losses > 0 but got {pair=}")
        ratios.append(math.log(measured / predicted))
    n = len(ratios)
    if n == 0:
        return LossCorrection()
    log_ratios = np.asarray(ratios)
    centre = float(np.median(log_ratios))
    log_sd = float(_MAD_TO_SD * np.median(np.abs(log_ratios - centre))) if n >= 2 else 0.0
    return LossCorrection(scale=math.exp(n / (n + 1) * centre), log_sd=log_sd, n_runs=n)
