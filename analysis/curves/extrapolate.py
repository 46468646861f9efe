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
start. That systematic gap is not modelled here; `analysis.curves.correction`, fitted from
full runs' measured final losses against their trials' predictions, absorbs it (and any
other bias of the extrapolation) as one multiplicative factor with its own spread.

Pure numpy/scipy: imports nothing from the project but its fit (`analysis.curves.power_law_fit`) and
noise estimate (`analysis.curves.noise`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import t as student_t

from analysis.curves.noise import MAD_TO_SD, Z90, chord_deviations
from analysis.curves.power_law_fit import N_PARAMETERS, best_fit, bootstrap_spread
from common.config import require_keys

FloatArray = NDArray[np.float64]

POWER_LAW = "power_law"
# How `analysis.curves.law_prediction` made a prediction it records as a CurveFit (see there).
LAW_METHODS = ("joint", "own")
FITTED = (POWER_LAW, *LAW_METHODS)
FALLBACKS = ("too_few_points", "flat", "rising", "poor_fit", "fallback")
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


def rounded_dict(record: Any) -> dict[str, Any]:
    """A dataclass record as a JSON-ready dict, its floats rounded to 6 significant digits."""
    return {
        name: float(f"{value:.6g}") if isinstance(value, float) else value
        for name, value in asdict(record).items()
    }


def number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number but got {value=}")
    return float(value)


def integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer but got {value=}")
    return value


@dataclass(frozen=True)
class CurveFit:
    """A learning curve's fit and its prediction of the loss at `target`.

    Attributes:
        method: "power_law", or the fallback used: "too_few_points", "flat", "rising",
            "poor_fit"; for a prediction of `analysis.curves.law_prediction`, "joint", "own" or
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
        return rounded_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CurveFit:
        """Build from `to_dict` output.

        Raises:
            ValueError: A field is unknown, missing or of the wrong type, or the values
                are inconsistent.
        """
        require_keys(cls, data, cls.__name__, every=True)
        for name in ("method", "reason"):
            if not isinstance(data[name], str):
                raise ValueError(f"{name} must be a string but got {data[name]=}")
        floats = {
            f.name: number(f.name, data[f.name])
            for f in fields(cls)
            if f.name not in ("method", "reason", "n_points")
        }
        return cls(
            method=str(data["method"]),
            reason=str(data["reason"]),
            n_points=integer("n_points", data["n_points"]),
            **floats,
        )


@dataclass(frozen=True)
class _Curve:
    """The validated observations and what every prediction records of them."""

    x: FloatArray
    losses: FloatArray
    target: float
    noise: float

    def result(
        self,
        method: str,
        reason: str,
        abc: tuple[float, float, float],
        band: tuple[float, float, float],
        residual_sd: float,
    ) -> CurveFit:
        """The fit of curve parameters `abc` with the p10, p50, p90 `band` at the target."""
        (a, b, c), (p10, p50, p90) = abc, band
        return CurveFit(
            method=method, reason=reason, a=a, b=b, c=c, x0=float(self.x[0]), target=self.target,
            p10=p10, p50=p50, p90=p90, n_points=int(self.losses.size), residual_sd=residual_sd,
            last_loss=float(self.losses[-1]),
        )  # fmt: skip

    def fallback(self, method: str, reason: str, p10: float, p50: float, p90: float) -> CurveFit:
        """A constant level `p50` with its band (p10 clipped at 0) and the curve's noise."""
        return self.result(method, reason, (p50, 0.0, 0.0), (max(p10, 0.0), p50, p90), self.noise)


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
    x_arr, y, target = _checked(x, losses, target, min_points=min_points, bootstrap=bootstrap)
    if y.size < min_points:
        return _too_few(_Curve(x_arr, y, target, float(np.std(y[-2:]))), min_points)
    deviations = chord_deviations(x_arr, y)
    noise = max(float(MAD_TO_SD * np.median(np.abs(deviations))), 1e-9 * float(np.max(y)), 1e-12)
    curve = _Curve(x_arr, y, target, noise)
    return (
        _rising(curve) or _not_improving(curve) or _extrapolate(curve, deviations, bootstrap, seed)
    )


def _checked(
    x: ArrayLike, losses: ArrayLike, target: float, *, min_points: int, bootstrap: int
) -> tuple[FloatArray, FloatArray, float]:
    """`fit_curve`'s arguments as arrays and a float, or a ValueError naming the bad one."""
    x_arr = np.asarray(x, dtype=float)
    y = np.asarray(losses, dtype=float)
    target = float(target)
    _check_inputs(x_arr, y, target)
    if isinstance(min_points, bool) or not isinstance(min_points, int) or min_points < 4:
        raise ValueError(f"min_points must be an integer >= 4 but got {min_points=}")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise ValueError(f"bootstrap must be an integer >= 0 but got {bootstrap=}")
    return x_arr, y, target


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


def _rising(curve: _Curve) -> CurveFit | None:
    """The rising fallback when the curve climbed back above its minimum, else None."""
    y = curve.losses
    last, lowest = float(y[-1]), float(np.min(y))
    # Both of the last two points must have risen: one high point is too often just noise.
    risen = float(np.min(y[-2:]))
    if risen > lowest + _RISING_NOISE * curve.noise and risen > _RISING_RATIO * lowest:
        reason = f"loss rose from its minimum {lowest:.4g} to {last:.4g}: no decay to extrapolate"
        return curve.fallback("rising", reason, lowest, last, 2 * last - lowest)
    return None


def _not_improving(curve: _Curve) -> CurveFit | None:
    """The flat fallback when the curve's start and end differ within the noise, else None."""
    y, noise = curve.losses, curve.noise
    improvement = float(np.mean(y[:2]) - np.mean(y[-2:]))
    if improvement < _FLAT_NOISE * noise:
        return _flat(curve, f"loss improved by {improvement:.3g}, within its noise {noise:.3g}")
    return None


def _extrapolate(curve: _Curve, deviations: FloatArray, bootstrap: int, seed: int) -> CurveFit:
    """The power law's prediction at the target, or the fallback its fit calls for."""
    x_arr, y, noise = curve.x, curve.losses, curve.noise
    x0 = float(x_arr[0])
    f_scale = _F_SCALE_NOISE * noise
    best = best_fit(x_arr / x0, y, f_scale)
    theta = np.asarray(best.x, dtype=float)
    a, b, c = (float(v) for v in theta)
    residuals = y - power_law(x_arr, a, b, c, x0)
    dof_factor = math.sqrt(y.size / (y.size - N_PARAMETERS))
    residual_sd = float(MAD_TO_SD * np.median(np.abs(residuals))) * dof_factor
    fitted_drop = b * (1.0 - float(x_arr[-1] / x0) ** (-c))
    if fitted_drop < _FLAT_NOISE * noise:
        return _flat(curve, f"the fitted decay {fitted_drop:.3g} is within the noise {noise:.3g}")
    # A ratio of two noisy sd estimates: the efficient (root-mean-square) ones keep chance
    # ratios above 3 rare with ~10 points, while a curve the law cannot bend to exceeds it.
    misfit_rms = float(np.sqrt(np.mean(residuals**2))) * dof_factor
    noise_rms = float(np.sqrt(np.mean(deviations**2)))
    if not best.success or misfit_rms > max(
        _POOR_FIT_NOISE * noise_rms, _POOR_FIT_RELATIVE * float(y[-1])
    ):
        reason = (
            f"the power law misses the curve: residual rms {misfit_rms:.3g}, noise {noise_rms:.3g}"
        )
        return _poor_fit(curve, reason, residual_sd)
    p10, p50, p90 = _band(
        curve, theta, residuals, residual_sd, f_scale=f_scale, bootstrap=bootstrap, seed=seed
    )
    if not all(math.isfinite(v) for v in (p10, p50, p90)):
        reason = f"the power law overflows at target {curve.target:.4g}"
        return _poor_fit(curve, reason, residual_sd)
    return curve.result(POWER_LAW, "", (a, b, c), (p10, p50, p90), residual_sd)


def _band(
    curve: _Curve,
    theta: FloatArray,
    residuals: FloatArray,
    residual_sd: float,
    *,
    f_scale: float,
    bootstrap: int,
    seed: int,
) -> tuple[float, float, float]:
    """p10, p50, p90 at the target: the law's value, with the spread of `bootstrap` refits and
    one evaluation's noise added in quadrature."""
    x0 = float(curve.x[0])
    a, b, c = (float(v) for v in theta)
    p50 = float(power_law(curve.target, a, b, c, x0))
    low = high = 0.0
    if bootstrap > 0:
        q10, q90 = bootstrap_spread(
            theta, curve.x / x0, residuals, curve.losses, curve.target / x0,
            f_scale=f_scale, resamples=bootstrap, seed=seed,
        )  # fmt: skip
        low, high = max(p50 - q10, 0.0), max(q90 - p50, 0.0)
    # Both spreads come from n residuals standing in for the noise's unknown sd: widen them
    # by Student's t over the normal quantile, as a t interval would (x1.10 at 10 points).
    widen = float(student_t.ppf(0.9, curve.losses.size - N_PARAMETERS)) / Z90
    noise_term = Z90 * residual_sd
    p10 = max(p50 - widen * math.hypot(low, noise_term), 0.0)
    return p10, p50, p50 + widen * math.hypot(high, noise_term)
