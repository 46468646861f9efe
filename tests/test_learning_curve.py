from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis.curves.correction import SHAPED_SHRINK_RUNS, LossCorrection, fit_loss_correction
from analysis.curves.extrapolate import CurveFit, fit_curve, power_law

LINEAR_X = np.arange(1, 13) * 2e5  # an evaluation every 200k tokens
PARAMETER_SETS = [
    (1.2, 1.0, 0.5),
    (1.5, 0.6, 0.3),
    (0.8, 1.5, 0.8),
    (2.0, 0.5, 0.4),
    (1.0, 1.0, 0.6),
]


def noisy(
    x: np.ndarray, a: float, b: float, c: float, *, seed: int, sd: float = 0.01
) -> np.ndarray:
    """A power-law curve with multiplicative noise of `sd` (1 % of the loss by default)."""
    true = power_law(x, a, b, c, float(x[0]))
    return true * (1 + sd * np.random.default_rng(seed).standard_normal(x.size))


def assert_ordered(fit: CurveFit) -> None:
    values = (fit.p10, fit.p50, fit.p90)
    assert all(math.isfinite(v) for v in values), values
    assert fit.p10 <= fit.p50 <= fit.p90, values


def a_fit(method: str = "power_law", **changes: object) -> CurveFit:
    values: dict[str, object] = dict(
        method=method, reason="" if method == "power_law" else "why", a=1.0, b=0.5, c=0.4,
        x0=1e5, target=1e7, p10=1.0, p50=1.1, p90=1.2, n_points=10, residual_sd=0.01,
        last_loss=1.3,
    )  # fmt: skip
    values.update(changes)
    return CurveFit(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("a, b, c", [*PARAMETER_SETS, (0.5, 2.0, 0.15), (1.5, 0.8, 2.0)])
@pytest.mark.parametrize("spacing", ["linear", "geometric"])
def test_recovers_noise_free_power_law(a: float, b: float, c: float, spacing: str) -> None:
    x = LINEAR_X if spacing == "linear" else np.geomspace(1e4, 1e6, 8)
    fit = fit_curve(x, power_law(x, a, b, c, float(x[0])), 10 * x[-1], bootstrap=0)
    assert fit.method == "power_law"
    assert (fit.a, fit.b, fit.c) == pytest.approx((a, b, c), rel=1e-3)
    assert fit.x0 == x[0]
    assert fit.p50 == pytest.approx(power_law(10 * x[-1], a, b, c, float(x[0])), rel=1e-4)


@pytest.mark.parametrize(
    "abc, tolerance",
    [
        ((1.0, 1.5, 0.8), (0.1, 0.15, 0.2)),
        ((0.6, 2.0, 1.2), (0.05, 0.1, 0.15)),
        ((1.2, 1.0, 0.5), (0.2, 0.2, 0.3)),  # slower decay: a and c trade off more
    ],
)
def test_recovers_noisy_power_law(
    abc: tuple[float, float, float], tolerance: tuple[float, float, float]
) -> None:
    a, b, c = abc
    true = power_law(LINEAR_X, a, b, c, float(LINEAR_X[0]))
    for seed in range(6):
        fit = fit_curve(LINEAR_X, noisy(LINEAR_X, a, b, c, seed=seed), 1e7, bootstrap=0)
        assert fit.method == "power_law", fit.reason
        errors = np.abs(np.array([fit.a - a, fit.b - b, fit.c - c]))
        assert np.all(errors <= tolerance), (seed, fit)
        assert np.max(np.abs(fit.predict(LINEAR_X) / true - 1)) < 0.02


def test_interval_covers_extrapolated_loss() -> None:
    # 30 noisy curves of 12 points each, predicted 8x beyond the last point. 100 resamples
    # (not the default 200) keep the test fast; coverage is nominally 80 %.
    hits, errors = [], []
    for seed in range(30):
        a, b, c = PARAMETER_SETS[seed % len(PARAMETER_SETS)]
        target = 8 * LINEAR_X[-1]
        y = noisy(LINEAR_X, a, b, c, seed=seed)
        fit = fit_curve(LINEAR_X, y, target, bootstrap=100, seed=seed)
        true = float(power_law(target, a, b, c, float(LINEAR_X[0])))
        assert_ordered(fit)
        hits.append(fit.p10 <= true <= fit.p90)
        errors.append(abs(fit.p50 / true - 1))
    assert np.mean(hits) >= 0.7
    assert np.median(errors) < 0.03


def test_too_few_points() -> None:
    for x, y in (([1e5, 2e5], [2.0, 1.8]), ([1e5], [2.0])):
        fit = fit_curve(x, y, 1e7)
        assert fit.method == "too_few_points" and fit.fell_back
        assert fit.reason
        assert_ordered(fit)
        assert fit.p50 == pytest.approx(np.mean(y))
        assert fit.p90 - fit.p50 >= 0.05 * fit.p50 - 1e-12  # the 5 % floor
        assert fit.predict(1e7) == fit.p50
    assert fit_curve([1e5, 2e5, 3e5, 4e5], [2.0, 1.8, 1.7, 1.65], 1e7, min_points=5).fell_back


def test_flat_curve() -> None:
    y = 1.5 * (1 + 0.005 * np.random.default_rng(0).standard_normal(LINEAR_X.size))
    fit = fit_curve(LINEAR_X, y, 1e7)
    assert fit.method == "flat" and fit.reason
    assert_ordered(fit)
    assert fit.p50 == pytest.approx(np.mean(y[-3:]))
    assert fit.p10 < 1.5 < fit.p90
    assert (fit.b, fit.c) == (0.0, 0.0)
    np.testing.assert_allclose(fit.predict(LINEAR_X), fit.p50)


def test_rising_curve() -> None:
    # Overfitting: the loss falls, bottoms out and climbs 10 % again.
    y = np.array([2.0, 1.7, 1.55, 1.5, 1.48, 1.5, 1.53, 1.56, 1.6, 1.63])
    fit = fit_curve(LINEAR_X[:10], y, 1e7)
    assert fit.method == "rising" and fit.reason
    assert_ordered(fit)
    assert (fit.p10, fit.p50, fit.p90) == pytest.approx((1.48, 1.63, 1.78))


def test_single_high_last_point_is_not_rising() -> None:
    y = power_law(LINEAR_X, 1.2, 1.0, 0.5, float(LINEAR_X[0]))
    y[-1] *= 1.05
    assert fit_curve(LINEAR_X, y, 1e7, bootstrap=0).method != "rising"


def test_curve_the_power_law_cannot_follow() -> None:
    # A plateau during warm-up, then a sudden drop: no power law bends like that.
    y = np.array([2.0, 2.0, 1.99, 1.99, 1.8, 1.6, 1.5, 1.45, 1.42, 1.4])
    fit = fit_curve(LINEAR_X[:10], y, 1e7)
    assert fit.method == "poor_fit" and fit.reason
    assert_ordered(fit)
    assert fit.p50 == 1.4
    assert fit.p90 - fit.p10 >= 0.1 * 1.4 - 1e-12


def test_band_widens_with_distance() -> None:
    y = noisy(LINEAR_X, 1.2, 1.0, 0.5, seed=3)
    widths = [
        (fit.p90 - fit.p10)
        for fit in (fit_curve(LINEAR_X, y, m * LINEAR_X[-1], bootstrap=100) for m in (1, 3, 10, 30))
    ]
    assert widths == sorted(widths) and widths[-1] > 2 * widths[0], widths


def test_interpolation_band_comes_from_residual_noise() -> None:
    y = noisy(LINEAR_X, 1.2, 1.0, 0.5, seed=4)
    fit = fit_curve(LINEAR_X, y, float(LINEAR_X[5]), bootstrap=100)
    assert fit.method == "power_law"
    assert_ordered(fit)
    half_width = (fit.p90 - fit.p10) / 2
    assert 1.2 * fit.residual_sd < half_width < 2.5 * fit.residual_sd


def test_bootstrap_widens_and_is_deterministic() -> None:
    y = noisy(LINEAR_X, 1.2, 1.0, 0.5, seed=5)
    target = 10 * LINEAR_X[-1]
    first = fit_curve(LINEAR_X, y, target, bootstrap=50, seed=7)
    assert first == fit_curve(LINEAR_X, y, target, bootstrap=50, seed=7)
    assert first != fit_curve(LINEAR_X, y, target, bootstrap=50, seed=8)
    no_bootstrap = fit_curve(LINEAR_X, y, target, bootstrap=0)
    assert no_bootstrap.p50 == first.p50
    assert no_bootstrap.p90 - no_bootstrap.p10 < 0.8 * (first.p90 - first.p10)


def test_predict_evaluates_the_fitted_curve() -> None:
    fit = a_fit()
    assert fit.predict(1e5) == pytest.approx(1.5)
    assert isinstance(fit.predict(4e5), float)
    values = fit.predict(np.array([[1e5, 1e6]]))
    assert values.shape == (1, 2)
    np.testing.assert_allclose(values, 1.0 + 0.5 * np.array([[1.0, 10**-0.4]]))


def test_curve_fit_round_trips_through_json() -> None:
    fit = fit_curve(LINEAR_X, noisy(LINEAR_X, 1.2, 1.0, 0.5, seed=6), 1e7, bootstrap=20)
    data = json.loads(json.dumps(fit.to_dict()))
    again = CurveFit.from_dict(data)
    assert again.to_dict() == data
    assert data["p50"] == float(f"{fit.p50:.6g}")
    for name in ("a", "b", "c", "p10", "p50", "p90", "residual_sd"):
        assert getattr(again, name) == pytest.approx(getattr(fit, name), rel=1e-5)
    flat = fit_curve(LINEAR_X, np.full(LINEAR_X.size, 1.5), 1e7)
    assert flat.method == "flat"
    assert CurveFit.from_dict(flat.to_dict()).to_dict() == flat.to_dict()


def test_curve_fit_from_dict_rejects_bad_records() -> None:
    data = a_fit().to_dict()
    with pytest.raises(ValueError, match="colour"):
        CurveFit.from_dict({**data, "colour": "red"})
    with pytest.raises(ValueError, match="p50"):
        CurveFit.from_dict({k: v for k, v in data.items() if k != "p50"})
    with pytest.raises(ValueError, match="n_points"):
        CurveFit.from_dict({**data, "n_points": "ten"})
    with pytest.raises(ValueError, match="p10"):
        CurveFit.from_dict({**data, "p10": 1.15})
    with pytest.raises(ValueError, match="method"):
        CurveFit.from_dict({**data, "method": "spline"})
    with pytest.raises(ValueError, match="reason"):
        CurveFit.from_dict({**data, "method": "flat", "reason": ""})


@pytest.mark.parametrize(
    "x, losses, target, kwargs, name",
    [
        ([1e5, 3e5, 2e5, 4e5], [2.0, 1.8, 1.7, 1.6], 1e7, {}, "strictly increasing"),
        ([1e5, 2e5, 2e5, 4e5], [2.0, 1.8, 1.7, 1.6], 1e7, {}, "strictly increasing"),
        ([0.0, 2e5, 3e5, 4e5], [2.0, 1.8, 1.7, 1.6], 1e7, {}, "x must be finite and > 0"),
        ([1e5, 2e5, 3e5], [2.0, 1.8, 1.7, 1.6], 1e7, {}, "same length"),
        ([], [], 1e7, {}, "at least one point"),
        ([1e5, 2e5, 3e5, 4e5], [2.0, float("nan"), 1.7, 1.6], 1e7, {}, "losses"),
        ([1e5, 2e5, 3e5, 4e5], [2.0, 1.8, 1.7, 1.6], 0.0, {}, "target"),
        ([1e5, 2e5, 3e5, 4e5], [2.0, 1.8, 1.7, 1.6], -1e7, {}, "target"),
        ([1e5, 2e5, 3e5, 4e5], [2.0, 1.8, 1.7, 1.6], float("inf"), {}, "target"),
        ([1e5, 2e5, 3e5, 4e5], [2.0, 1.8, 1.7, 1.6], 1e7, {"min_points": 3}, "min_points"),
        ([1e5, 2e5, 3e5, 4e5], [2.0, 1.8, 1.7, 1.6], 1e7, {"bootstrap": -1}, "bootstrap"),
    ],
)
def test_fit_curve_rejects_bad_input(
    x: list[float], losses: list[float], target: float, kwargs: dict[str, int], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        fit_curve(x, losses, target, **kwargs)


def test_loss_correction_identity_when_no_runs() -> None:
    correction = fit_loss_correction([])
    assert correction == LossCorrection(scale=1.0, log_sd=0.0, n_runs=0, version=1)
    fit = a_fit()
    assert correction.apply(fit) == fit


def test_loss_correction_finds_the_ratio() -> None:
    rng = np.random.default_rng(0)
    predicted = rng.uniform(1.0, 2.0, size=20)
    measured = predicted * 0.9 * np.exp(0.03 * rng.standard_normal(20))
    correction = fit_loss_correction(list(zip(predicted, measured, strict=True)))
    assert correction.n_runs == 20
    assert correction.scale == pytest.approx(0.9, abs=0.02)
    assert 0.015 < correction.log_sd < 0.06


def test_single_run_is_shrunk_toward_one() -> None:
    correction = fit_loss_correction([(1.0, 0.8)])
    assert correction.scale == pytest.approx(math.sqrt(0.8))  # half-way in log space
    assert correction.log_sd == 0.0 and correction.n_runs == 1
    two = fit_loss_correction([(1.0, 0.8), (2.0, 1.6)])
    assert two.scale == pytest.approx(0.8 ** (2 / 3))
    assert two.log_sd == 0.0


def test_a_prediction_of_an_identified_shape_is_corrected_less() -> None:
    """Where the study identified the loss shape a run's ratio is mostly its own
    configuration's error: its median ratio is shrunk as with `SHAPED_SHRINK_RUNS` more runs
    at their prediction, not one."""
    one = fit_loss_correction([(1.0, 0.8)])
    assert one.for_shape(False) is one
    shaped = one.for_shape(True)
    assert shaped.scale == pytest.approx(0.8 ** (1 / (1 + SHAPED_SHRINK_RUNS)))
    assert 0.8**0.5 < shaped.scale < 1.0
    assert (shaped.log_sd, shaped.n_runs) == (one.log_sd, one.n_runs)
    many = fit_loss_correction([(1.0, 0.8)] * SHAPED_SHRINK_RUNS)
    assert many.for_shape(True).scale == pytest.approx(0.8**0.5)  # half-way
    assert fit_loss_correction([]).for_shape(True) == LossCorrection()


def test_loss_correction_scales_and_widens() -> None:
    fit = a_fit(method="flat")
    corrected = LossCorrection(scale=0.9, log_sd=0.05, n_runs=5).apply(fit)
    assert corrected.method == "flat" and corrected.reason == fit.reason
    assert corrected.p50 == pytest.approx(0.99)
    assert corrected.p10 < 0.9 * fit.p10 and corrected.p90 > 0.9 * fit.p90
    expected_low = math.hypot(math.log(1.1 / 1.0), 1.2815515655446004 * 0.05)
    assert math.log(corrected.p50 / corrected.p10) == pytest.approx(expected_low)
    assert (corrected.a, corrected.b, corrected.c) == (fit.a, fit.b, fit.c)
    scaled_only = LossCorrection(scale=0.9, log_sd=0.0, n_runs=1).apply(fit)
    assert (scaled_only.p10, scaled_only.p50, scaled_only.p90) == pytest.approx((0.9, 0.99, 1.08))


def test_loss_correction_round_trips_and_rejects_bad_input() -> None:
    correction = fit_loss_correction([(1.0, 0.8), (2.0, 1.7), (1.5, 1.3)])
    data = json.loads(json.dumps(correction.to_dict()))
    assert data["version"] == 1
    assert LossCorrection.from_dict(data).to_dict() == data
    assert LossCorrection.from_dict(data).scale == pytest.approx(correction.scale, rel=1e-5)
    with pytest.raises(ValueError, match="offset"):
        LossCorrection.from_dict({**data, "offset": 0.1})
    with pytest.raises(ValueError, match="version"):
        LossCorrection.from_dict({**data, "version": 2})
    with pytest.raises(ValueError, match="scale"):
        LossCorrection(scale=0.0)
    with pytest.raises(ValueError, match=r"pairs\[1\]"):
        fit_loss_correction([(1.0, 0.8), (1.0, -0.5)])
