from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from analysis.calibration.file import VERSION, Calibration, load, load_for
from analysis.calibration.fit import fit, update
from analysis.calibration.measurements import RunMeasurements
from analysis.calibration.robust_fit import leave_one_out_fits, robust_positive_fit
from analysis.calibration.spread import configuration
from analysis.timemodel.hardware import fingerprint, prior_coefficients
from analysis.timemodel.model import Coefficients, ModelProfile, Plan, predict
from analysis.timemodel.workload import (
    NF4_STEP_FACTOR,
    activation_bytes,
    adapter_flops,
    attention_flops,
    frozen_flops,
    static_memory_bytes,
)
from common.errors import BadInputError
from tests.test_timemodel import CPU, MODEL

PRIOR = prior_coefficients(CPU, cpu_probe=lambda: 40e9)
# The "real machine": every rate 1.5-3x away from the prior, as uncalibrated guesses are.
TRUTH = dataclasses.replace(
    PRIOR,
    micro_fixed_seconds=0.05,
    micro_seconds_per_flop=2.5 / 20e9,
    micro_seconds_per_adapter_flop=2.5 / 20e9,
    micro_seconds_per_attention_flop=1.5 / 10e9,
    optimizer_fixed_seconds=0.004,
    optimizer_seconds_per_parameter=8e-9,
    eval_fixed_seconds=0.3,
    eval_seconds_per_flop=1.5 / 20e9,
    checkpoint_fixed_seconds=0.4,
    checkpoint_seconds_per_parameter=2e-7,
    startup_fixed_seconds=6.0,
    startup_seconds_per_parameter=4e-8,
    memory_fixed_bytes=600e6,
    activation_memory_scale=0.7,
)
# A plan of one configuration of the synthetic runs' kind, whose prediction the tests check.
PLAN = Plan(
    model=MODEL,
    token_lengths=tuple(range(16, 257)),
    epochs=3.0,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_length=256,
    lora_r=16,
    eval_interval_steps=20,
    eval_samples=100,
    checkpoint_interval_steps=50,
)
CONFIGS = [  # (micro_batch_size, lora_r, gradient_checkpointing)
    (1, 4, False),
    (2, 8, False),
    (4, 16, True),
    (8, 32, False),
    (4, 64, False),
    (2, 16, True),
    (1, 32, False),
    (8, 8, True),
]


def synthetic_run(
    rng: np.random.Generator,
    batch: int,
    rank: int,
    gc: bool,
    *,
    steps: int = 203,
    noise: float = 0.05,
    outliers: float = 0.0,
    with_checkpoints: bool = True,
    truth: Coefficients = TRUTH,
    model: ModelProfile = MODEL,
    quantization: str = "none",
) -> RunMeasurements:
    """Measurements generated from `truth` with log-normal noise and x3 stalls.

    An NF4 run (`quantization="nf4"`) takes `NF4_STEP_FACTOR` times longer per micro-step
    and holds its base's linear layers in 4 bits.
    """
    t = truth
    params = rank * model.lora_parameters_per_rank
    seq = rng.integers(8, 513, size=steps)
    tokens = batch * seq
    seconds = (
        t.micro_fixed_seconds
        + t.micro_seconds_per_flop * frozen_flops(model.total_parameters, 1.0, gc) * tokens
        + t.adapter_seconds_per_flop * adapter_flops(params, 1.0, gc) * tokens
        + t.micro_seconds_per_attention_flop * attention_flops(model, 1.0, gc) * tokens * seq
    ) * np.exp(rng.normal(0.0, noise, size=steps))
    seconds = np.where(rng.random(steps) < outliers, 3.0 * seconds, seconds)
    seconds *= NF4_STEP_FACTOR if quantization == "nf4" else 1.0
    seconds[:3] *= 10.0  # warm-up
    n_opt = steps // 4
    opt = (t.optimizer_fixed_seconds + t.optimizer_seconds_per_parameter * params) * np.exp(
        rng.normal(0.0, noise, size=n_opt)
    )
    eval_tokens = rng.integers(2000, 20000, size=4)
    evals = (
        t.eval_fixed_seconds + t.eval_seconds_per_flop * 2 * model.total_parameters * eval_tokens
    ) * np.exp(rng.normal(0.0, noise, size=4))
    ckpt = (t.checkpoint_fixed_seconds + t.checkpoint_seconds_per_parameter * params) * np.exp(
        rng.normal(0.0, noise, size=3)
    )
    peak = (
        t.memory_fixed_bytes
        + static_memory_bytes(model, params, "fp32", quantization)
        + t.activation_memory_scale * activation_bytes(model, batch, int(seq.max()), "fp32", gc)
    )
    return RunMeasurements.from_result_dict(
        {
            "micro_step_seconds": seconds.tolist(),
            "micro_step_tokens": tokens.tolist(),
            "micro_step_seq_len": seq.tolist(),
            "micro_batch_size": batch,
            "optimizer_step_seconds": [0.5, *opt.tolist()],  # the first step allocates state
            "eval_records": [
                {"step": i, "loss": 2.0, "seconds": float(s), "tokens": int(k)}
                for i, (s, k) in enumerate(zip(evals, eval_tokens, strict=True))
            ],
            "checkpoint_seconds": ckpt.tolist() if with_checkpoints else [],
            "startup_seconds": float(
                (t.startup_fixed_seconds + t.startup_seconds_per_parameter * model.total_parameters)
                * np.exp(rng.normal(0, noise))
            ),
            "peak_memory_bytes": int(peak),
            "config": {
                "lora_r": rank,
                "trainable_parameters": params,
                "gradient_checkpointing": gc,
                "max_length": 512,
                "quantization": quantization,
            },
        }
    )


def runs(seed: int = 0, **kwargs: object) -> list[RunMeasurements]:
    rng = np.random.default_rng(seed)
    return [synthetic_run(rng, b, r, gc, **kwargs) for b, r, gc in CONFIGS]  # type: ignore[arg-type]


# Tolerances: the dominant rates are pinned by the data to ~1 %; the fixed overhead and the
# attention term explain a small share of each step, so 5 % noise leaves ~5 % on them
# (worst case over 24 seeds: 5.3 % and 4.0 %).
TOLERANCES = {
    "micro_fixed_seconds": 0.07,
    "micro_seconds_per_flop": 0.02,
    "micro_seconds_per_attention_flop": 0.06,
    "optimizer_fixed_seconds": 0.02,
    "optimizer_seconds_per_parameter": 0.04,
}


def micro_seconds(c: Coefficients, batch: int, seq: int, params: int) -> float:
    tokens = batch * seq
    return (
        c.micro_fixed_seconds
        + c.micro_seconds_per_flop * frozen_flops(MODEL.total_parameters, tokens, False)
        + c.adapter_seconds_per_flop * adapter_flops(params, tokens, False)
        + c.micro_seconds_per_attention_flop * attention_flops(MODEL, tokens * seq, False)
    )


def eval_seconds(c: Coefficients, tokens: int) -> float:
    return c.eval_fixed_seconds + c.eval_seconds_per_flop * 2 * MODEL.total_parameters * tokens


def checkpoint_seconds(c: Coefficients, rank: int) -> float:
    params = rank * MODEL.lora_parameters_per_rank
    return c.checkpoint_fixed_seconds + c.checkpoint_seconds_per_parameter * params


@pytest.mark.parametrize("outliers", [0.0, 0.1])
def test_fit_recovers_coefficients(outliers: float) -> None:
    cal = fit(runs(outliers=outliers), MODEL, CPU, prior=PRIOR)
    got = cal.coefficients
    for name, tolerance in TOLERANCES.items():
        assert getattr(got, name) == pytest.approx(getattr(TRUTH, name), rel=tolerance), name
    for batch in (1, 4, 8):
        for seq in (8, 64, 512):
            assert micro_seconds(got, batch, seq, 8192) == pytest.approx(
                micro_seconds(TRUTH, batch, seq, 8192), rel=0.02
            )
    # Eval and checkpoints have few samples each: check what they predict.
    for tokens in (2000, 20000):
        assert eval_seconds(got, tokens) == pytest.approx(eval_seconds(TRUTH, tokens), rel=0.03)
    for rank in (4, 64):
        assert checkpoint_seconds(got, rank) == pytest.approx(
            checkpoint_seconds(TRUTH, rank), rel=0.03
        )
    # The weak pull of the fixed part to its prior leaves ~1 % on the scale.
    assert got.activation_memory_scale == pytest.approx(0.7, rel=0.015)
    assert got.memory_fixed_bytes == pytest.approx(600e6, rel=0.02)
    # Stalls are real time: the mean step is ~1 + 0.1 * 2 times the typical one.
    assert got.step_mean_ratio == pytest.approx(1.0 + 2 * outliers, abs=0.05)


def test_gross_outliers_barely_move_the_fit() -> None:
    clean = fit(runs(seed=7), MODEL, CPU, prior=PRIOR).coefficients
    dirty = fit(runs(seed=7, outliers=0.1), MODEL, CPU, prior=PRIOR).coefficients
    for name in TOLERANCES:
        assert getattr(dirty, name) == pytest.approx(getattr(clean, name), rel=0.03), name


def test_calibrated_prediction_matches_truth() -> None:
    cal = fit(runs(), MODEL, CPU, prior=PRIOR)
    plan = PLAN
    # The synthetic warm-up (10x steps) is not TRUTH's; it has its own test.
    warm = dataclasses.replace(TRUTH, warmup_seconds=cal.coefficients.warmup_seconds)
    truth, got = predict(plan, warm), predict(plan, cal.coefficients)
    for part in ("train", "eval", "checkpoint", "startup"):
        assert got.breakdown[part] == pytest.approx(truth.breakdown[part], rel=0.05), part
    assert got.seconds_p10 < truth.seconds_p50 < got.seconds_p90
    assert got.seconds_p90 / got.seconds_p50 < 1.3  # calibrated: much narrower than the prior
    assert got.source == f"calibration:{cal.calibration_id}"


def test_nf4_runs_calibrate_the_model_without_counting_nf4_twice() -> None:
    # QLoRA trials measure slower steps and smaller weights; `predict` applies both to an
    # NF4 plan, so the fit must take them out: fitted on NF4 runs alone, the coefficients
    # are the unquantized machine's, and an NF4 plan is predicted as NF4 runs measure.
    got = fit(runs(seed=3, quantization="nf4"), MODEL, CPU, prior=PRIOR).coefficients
    for batch, seq in ((1, 64), (8, 512)):
        assert micro_seconds(got, batch, seq, 8192) == pytest.approx(
            micro_seconds(TRUTH, batch, seq, 8192), rel=0.03
        )
    assert got.activation_memory_scale == pytest.approx(0.7, rel=0.02)
    assert got.memory_fixed_bytes == pytest.approx(600e6, rel=0.03)
    nf4 = dataclasses.replace(PLAN, quantization="nf4")
    warm = dataclasses.replace(TRUTH, warmup_seconds=got.warmup_seconds)
    truth, predicted = predict(nf4, warm), predict(nf4, got)
    assert predicted.breakdown["train"] == pytest.approx(truth.breakdown["train"], rel=0.05)
    assert predicted.peak_memory_bytes == pytest.approx(truth.peak_memory_bytes, rel=0.03)
    # Unquantized and NF4 runs of one configuration are not one configuration's repeats.
    mixed = [runs(seed=5)[0], runs(seed=5, quantization="nf4")[0]]
    assert len({configuration(r) for r in mixed}) == 2


def test_adapter_flops_are_fitted_apart() -> None:
    # A tiny model whose adapters at rank 64 have as many parameters as the model itself,
    # and whose thin adapter matmuls run at a third of the frozen weights' rate per FLOP.
    tiny = ModelProfile(180_000, 2, 64, 700, 2944)
    truth = dataclasses.replace(
        TRUTH, micro_seconds_per_adapter_flop=TRUTH.micro_seconds_per_flop / 3
    )
    rng = np.random.default_rng(4)
    measured = [
        synthetic_run(rng, b, r, gc, truth=truth, model=tiny)
        for b, r, gc in [(2, 4, False), (8, 32, False), (2, 32, False), (8, 4, False)]
    ]
    got = fit(measured, tiny, CPU, prior=PRIOR).coefficients
    assert got.adapter_seconds_per_flop == pytest.approx(truth.adapter_seconds_per_flop, rel=0.1)
    assert got.micro_seconds_per_flop == pytest.approx(truth.micro_seconds_per_flop, rel=0.1)


def test_missing_components_fall_back_to_prior() -> None:
    cal = fit(runs(with_checkpoints=False), MODEL, CPU, prior=PRIOR)
    assert cal.n_measurements["checkpoint"] == 0
    assert cal.coefficients.checkpoint_fixed_seconds == PRIOR.checkpoint_fixed_seconds
    assert (
        cal.coefficients.checkpoint_seconds_per_parameter == PRIOR.checkpoint_seconds_per_parameter
    )
    empty = fit([], MODEL, CPU, prior=PRIOR)
    assert empty.coefficients.micro_seconds_per_flop == PRIOR.micro_seconds_per_flop
    assert empty.coefficients.systematic_log_p90 == PRIOR.systematic_log_p90


def test_warmup_dropped_and_measurements_capped() -> None:
    run = synthetic_run(np.random.default_rng(1), 2, 8, False, steps=500)
    cal = fit([run], MODEL, CPU, prior=PRIOR)
    stored = cal.runs[0]
    # The warm-up steps are kept (they calibrate the warm-up cost) but not fitted as steps.
    assert len(stored.micro_step_seconds) == 3 + 200 and stored.warmup_steps == 3
    steady = stored.micro_step_seconds[3:]
    assert max(steady) < 5 * np.median(steady)
    # Steady steps at a length seen before fit the rates; the first at each length, apart.
    assert cal.n_measurements["micro_step"] + cal.n_measurements["new_shape"] == 200
    assert stored.micro_step_new_shape == run.capped().micro_step_new_shape  # from the full run
    assert stored.capped() == stored
    # Warm-up: 3 steps at 10x (9 steps' worth beyond steady time) and a 0.5 s first
    # optimizer step instead of a ~0.04 s one.
    params = 8 * MODEL.lora_parameters_per_rank
    extra = 9 * sum(micro_seconds(TRUTH, 2, s, params) for s in run.micro_step_seq_len[:3])
    extra += 0.5 - (TRUTH.optimizer_fixed_seconds + TRUTH.optimizer_seconds_per_parameter * params)
    assert cal.coefficients.warmup_seconds == pytest.approx(extra, rel=0.1)


def test_update_accumulates_runs() -> None:
    all_runs = runs(seed=3)
    cal = update(PRIOR, all_runs[0], model=MODEL, hardware=CPU)
    for run in all_runs[1:]:
        cal = update(cal, run)
    assert cal.n_measurements["runs"] == len(all_runs)
    direct = fit(all_runs, MODEL, CPU, prior=PRIOR)
    assert cal.coefficients == direct.coefficients
    with pytest.raises(ValueError, match="model="):
        update(PRIOR, all_runs[0])


def test_file_round_trip(tmp_path: Path) -> None:
    cal = fit(runs(), MODEL, CPU, prior=PRIOR)
    path = tmp_path / "sub" / "calibration.json"
    cal.save(path)
    back = load(path)
    assert back == cal
    assert [p.name for p in path.parent.iterdir()] == ["calibration.json"]  # no temp left over
    assert update(back, runs(seed=5)[0]).n_measurements["runs"] == len(CONFIGS) + 1


def test_load_for_fingerprint(tmp_path: Path) -> None:
    cal = fit(runs(), MODEL, CPU, prior=PRIOR)
    path = tmp_path / "calibration.json"
    assert load_for(path, cal.fingerprint) == (None, None)  # no file yet: silently priors
    cal.save(path)
    got, warning = load_for(path, cal.fingerprint)
    assert got == cal and warning is None
    other = fingerprint(dataclasses.replace(CPU, device_name="Other CPU"), MODEL)
    got, warning = load_for(path, other)
    assert got is None and warning is not None and other in warning


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: "{not json",
        lambda d: json.dumps([1, 2]),
        lambda d: json.dumps({**d, "format": "something-else"}),
        lambda d: json.dumps({**d, "version": VERSION + 1}),
        lambda d: json.dumps({**d, "version": "1"}),
        lambda d: json.dumps({k: v for k, v in d.items() if k != "coefficients"}),
        lambda d: json.dumps(
            {**d, "coefficients": {**d["coefficients"], "micro_fixed_seconds": "x"}}
        ),
        lambda d: json.dumps({**d, "hardware": {**d["hardware"], "device_kind": "tpu"}}),
        lambda d: json.dumps({**d, "runs": [{"micro_step_seconds": [1.0]}]}),
    ],
)
def test_malformed_file_raises(tmp_path: Path, corrupt: object) -> None:
    cal = fit(runs()[:1], MODEL, CPU, prior=PRIOR)
    path = tmp_path / "calibration.json"
    path.write_text(corrupt(cal.to_dict()))  # type: ignore[operator]
    with pytest.raises(BadInputError):
        load(path)
    with pytest.raises(BadInputError):
        load_for(path, cal.fingerprint)


def test_from_result_dict_errors() -> None:
    good = runs()[0].to_dict()
    assert RunMeasurements.from_result_dict(good).warmup_steps == 3
    clean = RunMeasurements.from_result_dict(good).capped()
    assert RunMeasurements.from_result_dict(clean.to_dict()) == clean
    with pytest.raises(BadInputError, match="lora_r"):
        RunMeasurements.from_result_dict({k: v for k, v in good.items() if k != "lora_r"})
    with pytest.raises(BadInputError, match="same length"):
        RunMeasurements.from_result_dict({**good, "micro_step_tokens": [1]})


def test_coefficients_dict_round_trip() -> None:
    assert Coefficients.from_dict(TRUTH.to_dict()) == TRUTH
    with pytest.raises(BadInputError):
        Coefficients.from_dict({**TRUTH.to_dict(), "bogus": 1.0})


def test_calibration_is_a_dataclass_with_id() -> None:
    cal = fit(runs()[:2], MODEL, CPU, prior=PRIOR)
    assert isinstance(cal, Calibration) and len(cal.calibration_id) == 10
    assert cal.fingerprint == fingerprint(CPU, MODEL)


def test_one_run_calibrates_memory() -> None:
    run = runs(seed=2)[3]
    cal = fit([run], MODEL, CPU, prior=PRIOR)
    assert cal.n_measurements["memory"] == 1
    plan = Plan(
        model=MODEL,
        token_lengths=(max(run.micro_step_seq_len),),
        epochs=1.0,
        micro_batch_size=run.micro_batch_size,
        gradient_accumulation_steps=1,
        max_length=512,
        lora_r=run.lora_r,
        eval_interval_steps=0,
        eval_samples=0,
        checkpoint_interval_steps=0,
        gradient_checkpointing=run.gradient_checkpointing,
    )
    assert predict(plan, cal.coefficients).peak_memory_bytes == pytest.approx(
        run.peak_memory_bytes, rel=0.01
    )
    assert predict(plan, PRIOR).peak_memory_bytes != pytest.approx(run.peak_memory_bytes, rel=0.05)


def test_reads_the_trainer_result() -> None:
    from trainers.result import TrainResult

    result = TrainResult(
        device="cpu",
        precision="fp32",
        runtime_reason="test",
        trainable_parameters=4096,
        total_parameters=MODEL.total_parameters,
        lora_targets=["q"],
        lora_parameters_per_rank=512,
        n_layers=4,
        hidden_size=256,
        vocab_size=5000,
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        max_length=64,
        lora_r=8,
        gradient_checkpointing=False,
        micro_step_seconds=[0.1] * 6,
        micro_step_tokens=[64] * 6,
        micro_step_seq_len=[32] * 6,
        optimizer_step_seconds=[0.01] * 6,
        eval_records=[{"step": 3, "loss": 2.0, "seconds": 0.5, "tokens": 900}],
        startup_seconds=3.0,
        peak_memory_bytes=10**9,
    )
    run = RunMeasurements.from_result_dict(result.to_dict())
    assert run.eval_tokens == (900,) and run.lora_r == 8 and run.max_length == 64
    assert fit([run], MODEL, CPU, prior=PRIOR).n_measurements["micro_step"] == 3


def test_the_newest_runs_that_measured_start_up_and_saves_are_kept() -> None:
    """Beyond the stored-run limit the oldest runs go, but not the newest few that measured
    start-up or timed a save: trials of a worker that keeps its base model measure neither,
    and a term fallen back to its prior (start-up 10 s on a CPU) refused every configuration
    of a tight window, so nothing measured it again."""
    from analysis.calibration.file import MAX_STORED_RUNS

    measured = runs(seed=3)[:2]  # the run that loaded the base, and one that timed saves
    plain = [
        dataclasses.replace(r, startup_seconds=0.0, checkpoint_seconds=())
        for r in runs(seed=4) * 12
    ][: MAX_STORED_RUNS + 10]
    calibration = fit([*measured, *plain], MODEL, CPU, prior=PRIOR)
    assert len(calibration.runs) == MAX_STORED_RUNS
    assert calibration.n_measurements["startup"] == 2
    assert calibration.n_measurements["checkpoint"] == sum(
        len(r.checkpoint_seconds) for r in measured
    )
    assert calibration.runs[:2] == tuple(r.capped() for r in measured)  # in order, oldest first
    assert calibration.runs[-1] == plain[-1].capped()  # the newest stay
    true = (
        TRUTH.startup_fixed_seconds + TRUTH.startup_seconds_per_parameter * MODEL.total_parameters
    )
    fitted = calibration.coefficients
    got = (
        fitted.startup_fixed_seconds + fitted.startup_seconds_per_parameter * MODEL.total_parameters
    )
    assert got == pytest.approx(true, rel=0.3)  # from the kept runs, not the prior
    # Under the limit nothing changes: every run, in order.
    assert fit(runs(seed=5), MODEL, CPU, prior=PRIOR).runs == tuple(
        r.capped() for r in runs(seed=5)
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_leave_one_out_refits_equal_scipy_refits_one_by_one(seed: int) -> None:
    """The vectorised leave-one-out fits of the memory margin solve what scipy's solver
    solves per left-out run (from the fit to all runs), gross outliers and an unusable
    observation included."""
    rng = np.random.default_rng(seed)
    n = 14
    x = np.column_stack([np.ones(n), rng.uniform(1e6, 5e8, n)])
    offset = rng.uniform(1e8, 2e8, n)
    truth = np.array([3e7, 6.0])
    y = (offset + x @ truth) * np.exp(rng.normal(0, 0.04, n))
    y[3] *= 2.5  # a gross outlier (a process whose memory ratcheted up)
    y[7] = np.nan  # not measured
    prior = np.array([5e7, 2.0])
    sd = np.array([0.5, 2.0])
    everything, _ = robust_positive_fit(x, y, prior, offset=offset, prior_log_sd=sd)
    fits = leave_one_out_fits(x, y, prior, everything, offset=offset, prior_log_sd=sd)
    assert fits.shape == (n, 2)
    for k in range(n):
        rows = np.arange(n) != k
        if k == 7:  # leaving out the unusable one leaves the usable ones
            rows = np.ones(n, dtype=bool)
        one, _ = robust_positive_fit(
            x[rows], y[rows], prior, offset=offset[rows], prior_log_sd=sd, start=everything
        )
        np.testing.assert_allclose(fits[k], one, rtol=1e-4)
    # They are refits, not the start handed back: leaving out a usable run moves the fit
    # (the Cauchy loss already all but ignores the outlier: leaving it out moves it least).
    moved = np.abs(np.log(fits[:, 1] / everything[1]))
    assert np.all(np.delete(moved, [3, 7]) > 1e-5)
    assert moved[3] < np.median(np.delete(moved, [3, 7]))


def test_the_device_is_judged_by_what_its_allocator_reserves() -> None:
    """CUDA runs out at the caching allocator's reserved peak, above what tensors hold: the
    memory check compares that, from the prior's ratio until trials measure their own."""
    from analysis.timemodel.hardware import CUDA_RESERVED_OVER_ALLOCATED, HardwareInfo
    from hpo.predictions import verdict_of

    gpu = HardwareInfo("cuda", "NVIDIA H100 80GB HBM3", int(79.2 * 2**30), 16, "bf16")
    assert prior_coefficients(gpu).reserved_over_allocated == CUDA_RESERVED_OVER_ALLOCATED > 1
    assert PRIOR.reserved_over_allocated == 1.0  # a CPU has no caching allocator
    measured = runs(seed=2)[:3]
    # Trials that measured their reserved peak: the largest ratio (one run's fragmentation is
    # the next one's out-of-memory); none measured: the prior's.
    reserved = [
        dataclasses.replace(r, peak_reserved_bytes=int(r.peak_memory_bytes * ratio))
        for r, ratio in zip(measured, (1.02, 1.30, 1.10), strict=True)
    ]
    ratio = fit(reserved, MODEL, CPU, prior=PRIOR).coefficients.reserved_over_allocated
    assert ratio == pytest.approx(1.30, rel=1e-6)
    assert fit(measured, MODEL, CPU, prior=PRIOR).coefficients.reserved_over_allocated == 1.0
    # A result file carries it; one written before it did reads as not measured.
    row = measured[0].to_dict()
    old = {k: v for k, v in row.items() if k != "peak_reserved_bytes"}
    assert RunMeasurements.from_result_dict(old).peak_reserved_bytes == 0
    row["peak_reserved_bytes"] = 3 * 10**9
    assert RunMeasurements.from_result_dict(row).peak_reserved_bytes == 3 * 10**9

    coefficients = dataclasses.replace(PRIOR, reserved_over_allocated=1.30)
    estimate = predict(PLAN, coefficients)
    assert estimate.peak_reserved_bytes_p90 == pytest.approx(1.30 * estimate.peak_memory_bytes_p90, rel=1e-6)
    assert estimate.memory_bound_bytes == estimate.peak_reserved_bytes_p90
    # A limit between the two p90s: the tensors fit, the allocator's blocks do not.
    limit = 1.15 * estimate.peak_memory_bytes_p90
    judged = verdict_of(estimate, estimate, coefficients, available_seconds=1e9, memory_limit_bytes=limit)
    assert not judged.feasible and "reserved by the allocator" in judged.reason
    plain = predict(PLAN, PRIOR)  # ratio 1: as before
    assert plain.memory_bound_bytes == plain.peak_memory_bytes_p90
    assert verdict_of(plain, plain, PRIOR, available_seconds=1e9, memory_limit_bytes=limit).feasible
