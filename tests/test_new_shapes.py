"""A micro-step at a padded length the run has not seen yet pays a one-off cost, fitted apart.

On an H100 such a step took 0.25-2 s against 0.1 s for a repeated length
(`docs/measurements/`): a 40-step probe with 22 lengths looked 2.5x slower than the long runs
it was to predict, and the time model over-predicted them by 21-66 %. Synthetic runs drawn
from known coefficients plus a known one-off cost: the fit must recover both, and `predict`
must charge each expected new length once.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from analysis.calibration.fit import fit
from analysis.calibration.measurements import RunMeasurements, first_seen
from analysis.timemodel.model import predict
from analysis.timemodel.workload import expected_new_shapes
from tests.test_calibration import PRIOR, TRUTH, micro_seconds
from tests.test_timemodel import CPU, MODEL, plan

ONE_OFF = 0.4  # seconds a new length costs on top of its step


def _run(rng: np.random.Generator, batch: int, rank: int, lengths: list[int]) -> RunMeasurements:
    params = rank * MODEL.lora_parameters_per_rank
    seq = rng.choice(lengths, size=203)
    seconds = np.array([micro_seconds(TRUTH, batch, int(s), params) for s in seq])
    seconds *= np.exp(rng.normal(0.0, 0.03, size=seq.size))
    seconds[:3] *= 10.0  # warm-up
    seconds += ONE_OFF * np.asarray(first_seen(seq.tolist()))
    return RunMeasurements.from_result_dict(
        {
            "micro_step_seconds": seconds.tolist(),
            "micro_step_tokens": (batch * seq).tolist(),
            "micro_step_seq_len": seq.tolist(),
            "micro_batch_size": batch,
            "optimizer_step_seconds": [0.05] * 50,
            "lora_r": rank,
            "trainable_parameters": params,
            "max_length": 512,
        }
    )


def test_first_seen_flags_each_new_length_once() -> None:
    assert first_seen([64, 64, 80, 64, 96, 80]) == (True, False, True, False, True, False)
    run = _run(np.random.default_rng(0), 2, 8, [64, 128])
    assert run.micro_step_new_shape == first_seen(run.micro_step_seq_len)
    # Stored and read back, the flags are the full run's, not re-derived from kept steps.
    assert RunMeasurements.from_result_dict(run.capped(20).to_dict()) == run.capped(20)


def test_one_off_cost_is_fitted_apart_from_the_step_rates() -> None:
    rng = np.random.default_rng(3)
    lengths = [int(v) for v in np.linspace(32, 512, 24)]
    runs = [_run(rng, b, r, lengths) for b, r in [(2, 4), (8, 32), (2, 32), (8, 4)]]
    got = fit(runs, MODEL, CPU, prior=PRIOR).coefficients
    assert got.new_shape_seconds == pytest.approx(ONE_OFF, rel=0.2)
    assert got.micro_fixed_seconds == pytest.approx(TRUTH.micro_fixed_seconds, rel=0.15)
    assert got.micro_seconds_per_flop == pytest.approx(TRUTH.micro_seconds_per_flop, rel=0.1)
    # The one-off costs are not smeared into the mean step either.
    assert got.step_mean_ratio < 1.1


def test_every_step_a_new_length_fits_them_together() -> None:
    """Runs whose lengths hardly repeat cannot tell the two costs apart: no split."""
    rng = np.random.default_rng(5)
    runs = [_run(rng, 2, 8, list(range(8, 513)))]
    cal = fit(runs, MODEL, CPU, prior=PRIOR)
    assert cal.n_measurements["new_shape"] == 0 and cal.coefficients.new_shape_seconds == 0.0
    assert cal.n_measurements["micro_step"] == 200


def test_expected_new_shapes() -> None:
    same = np.full(100, 64)
    assert expected_new_shapes(same, 4, 50) == pytest.approx(1.0)
    two = np.array([32, 64] * 50)
    assert expected_new_shapes(two, 1, 1) == pytest.approx(1.0)
    assert expected_new_shapes(two, 1, 200) == pytest.approx(2.0)
    # Larger micro-batches are padded to the longest more often: fewer distinct lengths.
    spread = np.arange(1, 201)
    assert expected_new_shapes(spread, 8, 100) < expected_new_shapes(spread, 1, 100) < 100


def test_predict_charges_each_expected_new_length_once() -> None:
    p = plan()
    with_cost = dataclasses.replace(TRUTH, new_shape_seconds=ONE_OFF)
    lengths = np.minimum(np.asarray(p.token_lengths), p.max_length)
    a, b = predict(p, TRUTH), predict(p, with_cost)
    new = expected_new_shapes(lengths, p.micro_batch_size, a.micro_steps) - 1.0
    assert new > 1.0
    assert b.breakdown["train"] - a.breakdown["train"] == pytest.approx(ONE_OFF * new)
