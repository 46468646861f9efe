"""The schedule-aware loss law: its schedule, its areas, the joint fit and honest bands.

Fitting tests use curves generated from the law itself with noise, so what they assert
holds by construction on any machine.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.curves.law import CurveData, JointFit, curve_data, fit_joint
from analysis.curves.law_prediction import FALLBACK, JOINT, OWN, predict_final
from analysis.curves.lr_schedule import FORWARD_POWER, learning_rates, schedule_areas, warmup_steps

SHARED = (1.5, 4.0, 0.7, 2.0, 0.0)  # L0, D, alpha, beta, C


@pytest.mark.parametrize("scheduler", ["linear", "cosine", "constant", "constant_with_warmup"])
@pytest.mark.parametrize(("total", "ratio"), [(50, 0.0), (97, 0.1), (7, 0.3)])
def test_the_schedule_is_transformers_own(scheduler: str, total: int, ratio: float) -> None:
    import torch
    from transformers import TrainingArguments, get_scheduler

    warm = warmup_steps(total, ratio)
    args = TrainingArguments(output_dir="unused", warmup_steps=ratio, report_to="none")
    assert warm == args.get_warmup_steps(total)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    schedule = get_scheduler(scheduler, optimizer, num_warmup_steps=warm, num_training_steps=total)
    expected = []
    for _ in range(total):  # the rate each update uses, then the scheduler steps
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert learning_rates(scheduler, total, warm, 3e-4) == pytest.approx(expected, rel=1e-9)


def test_areas_count_the_rate_and_its_drops() -> None:
    s1, s2 = schedule_areas(learning_rates("constant", 20, 0, 1e-3))
    assert s1 == pytest.approx(np.arange(1, 21))
    assert s2 == pytest.approx(np.zeros(20))
    rates = learning_rates("linear", 40, 0, 2e-3)
    s1, s2 = schedule_areas(rates, decay=0.0)
    # Without momentum the annealing area after a step is how far the rate has dropped.
    assert s2 == pytest.approx(1 - rates / rates[0])
    # Each step adds its share of the peak rate to the power FORWARD_POWER: the paper's
    # area under the rate at 1; a lower rate counts for more below 1.
    assert s1 == pytest.approx(np.cumsum((rates / rates[0]) ** FORWARD_POWER))
    area, _ = schedule_areas(rates, power=1.0)
    assert area[-1] == pytest.approx(np.sum(rates) / rates[0])
    assert np.all(s1[1:] > area[1:]) and s1[0] == pytest.approx(area[0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="power"):
        schedule_areas(rates, power=0.0)
    _, s2_momentum = schedule_areas(rates, decay=0.999)
    assert np.all(s2_momentum >= s2 - 1e-12) and s2_momentum[-1] > s2[-1]
    # Warm-up raises the rate: no annealing while it rises.
    _, s2_warm = schedule_areas(learning_rates("constant_with_warmup", 30, 10, 1e-3))
    assert s2_warm == pytest.approx(np.zeros(30))


def _law(shared: tuple[float, ...], log_tau: float, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    fit = JointFit((*shared,), (log_tau,), 0.0, 0)  # type: ignore[arg-type]
    return fit.loss(0, s1, s2)


def _curves(
    n: int, fraction: float, *, seed: int, shared: tuple[float, ...] = SHARED, noise: float = 0.004
) -> tuple[list[CurveData], list[float]]:
    """`n` trials of linear-decay runs, each observed over its first `fraction` in 6 points;
    and the truth at each full run's end."""
    rng = np.random.default_rng(seed)
    curves, truths = [], []
    for _ in range(n):
        total = int(rng.choice([100, 200, 400]))
        log_tau = float(rng.uniform(1.0, 3.5))
        rates = learning_rates("linear", total, 0, 1e-3)
        s1, s2 = schedule_areas(rates)
        steps = np.unique(np.linspace(1, max(2, round(fraction * total)), 6).round().astype(int))
        clean = _law(shared, log_tau, s1[steps - 1], s2[steps - 1])
        observed = clean + rng.normal(0, noise, clean.size)
        curves.append(curve_data(list(steps), list(observed), rates))
        truths.append(float(_law(shared, log_tau, s1[-1:], s2[-1:])[0]))
    return curves, truths


def test_the_joint_fit_predicts_the_end_of_curves_drawn_from_the_law() -> None:
    curves, truths = _curves(8, 0.3, seed=1)
    predictions = [predict_final(c, curves[:i] + curves[i + 1 :]) for i, c in enumerate(curves)]
    errors = [abs(p.p50 / t - 1) for p, t in zip(predictions, truths, strict=True)]
    assert all(p.method == JOINT and p.n_curves == 8 for p in predictions)
    assert float(np.median(errors)) < 0.05
    covered = sum(p.p10 <= t <= p.p90 for p, t in zip(predictions, truths, strict=True))
    assert covered >= 6


def test_a_curve_that_saw_the_decay_identifies_the_annealing_term() -> None:
    shared = (1.5, 4.0, 0.7, 2.0, 0.004)
    curves, truths = _curves(6, 0.1, seed=2, shared=shared)
    rates = learning_rates("linear", 300, 0, 1e-3)
    s1, s2 = schedule_areas(rates)
    steps = np.arange(10, 301, 10)  # a reference run to its end, through the whole decay
    rng = np.random.default_rng(3)
    losses = _law(shared, 2.0, s1[steps - 1], s2[steps - 1]) + rng.normal(0, 0.004, steps.size)
    reference = curve_data(list(steps), list(losses), rates)
    fit = fit_joint([*curves, reference], f_scale=0.008, max_annealing=1.0)
    assert fit.shared[4] == pytest.approx(0.004, rel=0.5)
    with_reference = predict_final(curves[0], [*curves[1:], reference])
    assert with_reference.p50 == pytest.approx(truths[0], rel=0.1)


def test_a_lone_short_curve_falls_back_and_says_why() -> None:
    curves, _ = _curves(1, 0.05, seed=4)
    short = CurveData(curves[0].s1[:3], curves[0].s2[:3], curves[0].losses[:3], 100.0, 50.0)
    alone = predict_final(short, [])
    assert alone.method == FALLBACK and "no other trial" in alone.reason
    assert alone.p50 == pytest.approx(float(short.losses[-1]))
    # The band reaches far below the last loss: the run has most of its way still to go.
    assert alone.p10 < 0.5 * alone.p50
    assert predict_final(curves[0], []).method == OWN


def test_a_rising_curve_falls_back_with_a_band_from_its_peers() -> None:
    curves, _ = _curves(5, 0.1, seed=5)
    s1 = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    rising = CurveData(s1, s1 * 0, np.array([4.0, 3.8, 3.7, 4.1, 4.3]), 150.0, 75.0)
    prediction = predict_final(rising, curves)
    assert prediction.method == FALLBACK and "rose" in prediction.reason
    assert prediction.n_curves == 5
    assert prediction.p10 <= prediction.p50 <= prediction.p90
    assert prediction.p90 >= 4.3  # staying where it is, is one plausible outcome
    assert (prediction.p90 - prediction.p10) / 2 > 0.05 * prediction.p50  # not +-5 %


def test_bands_widen_with_the_distance_of_extrapolation() -> None:
    near, _ = _curves(6, 0.3, seed=6)
    far, _ = _curves(6, 0.02, seed=6)
    width = [
        math.log(p.p90 / p.p10)
        for p in (predict_final(near[0], near[1:]), predict_final(far[0], far[1:]))
    ]
    assert width[1] > 1.5 * width[0]


def test_bad_input_names_the_value() -> None:
    with pytest.raises(ValueError, match="scheduler"):
        learning_rates("polynomial", 10, 0)
    with pytest.raises(ValueError, match="steps must lie"):
        curve_data([0, 1], [2.0, 1.9], learning_rates("linear", 5, 0))
    with pytest.raises(ValueError, match="warmup_ratio"):
        warmup_steps(10, 1.5)
    with pytest.raises(ValueError, match="at least one point"):
        predict_final(CurveData(np.array([]), np.array([]), np.array([]), 1.0, 0.0), [])


def test_an_evaluation_before_any_learning_rate_area_is_left_out() -> None:
    """A warm-up's first step runs at rate 0 (transformers' linear warm-up): S1 = 0 there."""
    rates = np.concatenate([np.linspace(0.0, 1e-3, 4, endpoint=False), np.full(28, 1e-3)])
    data = curve_data([1, 2, 4], [6.67, 6.66, 6.6], rates)
    assert data.s1.size == data.losses.size == 2 and np.all(data.s1 > 0)
    assert list(data.losses) == [6.66, 6.6]
    alone = curve_data([1], [6.67], rates)  # only the starting loss: kept, at the first area
    first_area = (rates[1] / rates.max()) ** FORWARD_POWER
    assert list(alone.losses) == [6.67] and alone.s1[0] == pytest.approx(first_area)
