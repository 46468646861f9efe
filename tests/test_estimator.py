"""The study's time model: over-budget configurations are never trained, nothing-fits stops
early with a suggestion, calibration carries over between studies, mismatches fall back."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient

from analysis.calibration.file import load
from analysis.calibration.fit import fit
from analysis.study_keys import TIME_MODEL_RUN_ATTR
from analysis.timemodel.hardware import HardwareInfo, prior_coefficients
from analysis.timemodel.machine import model_profile, this_machine
from analysis.timemodel.model import Coefficients
from common.errors import BadInputError
from common.workdir import CALIBRATION_FILE
from hpo.config import StudyConfig
from hpo.estimator import TIMED_SAVES_NEEDED, StudyEstimator, save_cost_known
from hpo.prepare import Prepared, prepare
from hpo.runner import run_study
from hpo.what_fits import (
    FEASIBLE_STARTS,
    PRIOR_MAX_PESSIMISM,
    PROBE_BEFORE_REFUSING_SECONDS,
    PROBE_SHARE_OF_SEARCH,
    TIME_NEUTRAL_PARAMS,
    candidates,
    check_space,
    feasible_starts,
)
from tests.cli import run_module
from tests.configs import short_study

HARDWARE = this_machine()
# Known rates: 10 ms a micro-step, 1 ms an optimizer step, a 1 s start-up, +-10 % band.
PINNED = dataclasses.replace(
    prior_coefficients(HARDWARE, cpu_probe=lambda: 1e10),
    micro_fixed_seconds=0.01,
    micro_seconds_per_flop=1e-18,
    micro_seconds_per_adapter_flop=1e-18,
    micro_seconds_per_attention_flop=1e-18,
    optimizer_fixed_seconds=0.001,
    optimizer_seconds_per_parameter=1e-15,
    eval_fixed_seconds=0.1,
    eval_seconds_per_batch=0.001,
    eval_seconds_per_flop=1e-18,
    checkpoint_fixed_seconds=0.1,
    checkpoint_seconds_per_parameter=1e-15,
    startup_fixed_seconds=1.0,
    startup_seconds_per_parameter=1e-15,
    data_seconds_per_token=0.0,
    warmup_seconds=0.0,
    loop_seconds_per_micro_step=0.0,
    memory_fixed_bytes=100 * 2**20,
    step_mean_ratio=1.0,
    step_noise_sd=0.0,
    systematic_log_p10=math.log(0.9),
    systematic_log_p90=math.log(1.1),
    source="pinned",
)


class PinnedEstimator(StudyEstimator):
    """Predicts with fixed coefficients, so which configurations fit is known in advance;
    everything else (constraints, calibration updates, honesty metrics) is the real thing."""

    @property
    def coefficients(self) -> Coefficients:
        return PINNED

    @property
    def calibrated(self) -> bool:
        return True  # its rates are known: nothing to measure before deciding


def config_for(work: Path, model: Path, **overrides: Any) -> StudyConfig:
    values = {"study_name": "budget", "n_trials": 2, "sampler": "random", "seed": 1}
    return short_study(work, model, {**values, **overrides})


def pinned(config: StudyConfig, prepared: Prepared) -> PinnedEstimator:
    return PinnedEstimator(config, prepared, model=model_profile(prepared.model_path))


def p90_seconds(estimator: StudyEstimator, micro_batch_size: int, accumulation: int) -> float:
    params = {
        **TIME_NEUTRAL_PARAMS,
        "micro_batch_size": micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "max_length": 128,
        "lora_r": 8,
        "gradient_checkpointing": False,
    }
    return estimator.verdict(params).full_run.seconds_p90


# ----------------------------------------------------------------------------- never trained


@pytest.fixture(scope="module")
def budget_study(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A study whose window fits micro-batch 16 but not micro-batch 8 (fast profile)."""
    work = tmp_path_factory.mktemp("budget")
    probe_config = config_for(work, tiny_model_dir, epochs=20.0)
    estimator = pinned(probe_config, prepare(probe_config))
    slowest_fit = p90_seconds(estimator, 16, 1)
    fastest_misfit = p90_seconds(estimator, 8, 2)
    assert slowest_fit < fastest_misfit / 1.5  # a clear gap to put the window in
    window = math.sqrt(slowest_fit * fastest_misfit)
    config = config_for(
        work,
        tiny_model_dir,
        epochs=20.0,
        n_trials=6,
        window_hours=window / 3600,
        safety_margin_minutes=0.0,
        reference_fraction=0.0,  # trials only: the loss-shape reference run is not counted here
    )
    calls: list[str] = []
    import trainers.loop.run

    real_train = trainers.loop.run.train

    def counting_train(spec: Any, callbacks: Any = (), **options: Any) -> Any:
        calls.append(Path(spec.output_dir).name)
        return real_train(spec, callbacks, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainers.loop.run, "train", counting_train)
        summary = run_study(config, progress=False, estimator_factory=pinned)
    study = optuna.load_study(study_name="budget", storage=config.storage_url)
    return config, summary, study, calls


def test_over_budget_configurations_are_never_trained(budget_study: Any) -> None:
    config, _, study, calls = budget_study
    trials = study.get_trials()
    over = [t for t in trials if t.user_attrs["micro_batch_size"] == 8]
    fits = [t for t in trials if t.user_attrs["micro_batch_size"] == 16]
    assert over and fits, "the seed must draw both micro-batch sizes"
    # Exactly the configurations that fit were trained, each once.
    assert sorted(calls) == sorted(f"trial-{t.number:03d}" for t in fits)
    for trial in over:
        assert trial.state == optuna.trial.TrialState.PRUNED
        reason = trial.user_attrs["state_reason"]
        assert reason.startswith("predicted ") and "(p90 " in reason and "available" in reason
        assert trial.constraints["duration"] > 0
        assert TIME_MODEL_RUN_ATTR not in trial.user_attrs  # no measurements: it never ran
        assert trial.user_attrs["estimate"]["fits_window"] is False
    for trial in fits:
        assert trial.constraints["duration"] <= 0 and trial.constraints["memory"] <= 0
        assert trial.user_attrs["estimate"]["fits_window"] is True
        assert trial.user_attrs["time_model_source"] == "pinned"


def test_never_trained_is_pruned_with_reason_in_mlflow(budget_study: Any) -> None:
    _, summary, study, _ = budget_study
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    for trial in study.get_trials():
        run = client.get_run(trial.user_attrs["mlflow_run_id"])
        if trial.user_attrs["micro_batch_size"] == 8:
            assert run.data.tags["state"] == "pruned"
            assert run.data.tags["reason"] == trial.user_attrs["state_reason"]
            assert run.data.tags["never_trained"] == "true"
            assert run.data.metrics["constraint_duration"] > 0
            assert "train_loss" not in run.data.metrics
        else:
            assert run.data.tags["state"] == "complete"
            # The honesty metric: the trial's own run, predicted before it ran, and measured.
            for key in ("predicted_trial_seconds", "measured_trial_seconds",
                        "trial_estimate_error_pct", "predicted_full_run_hours_p90"):  # fmt: skip
                assert key in run.data.metrics, key
                assert trial.user_attrs[key] == pytest.approx(run.data.metrics[key])


def test_trained_trials_calibrate_the_work_dir(budget_study: Any) -> None:
    config, _, study, calls = budget_study
    calibration = load(Path(config.work_dir) / CALIBRATION_FILE)
    assert calibration.n_measurements["runs"] == len(calls)
    trained = [t for t in study.get_trials() if TIME_MODEL_RUN_ATTR in t.user_attrs]
    assert len(trained) == len(calls)
    record = trained[0].user_attrs[TIME_MODEL_RUN_ATTR]
    assert record["hardware"]["device_kind"] == HARDWARE.device_kind
    assert len(record["run"]["micro_step_seconds"]) <= 3 + 48


# ----------------------------------------------------------------------------- nothing fits


def test_nothing_fits_exits_2_before_anything_is_written(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    proc = run_module(
        "hpo.study", "--model", str(tiny_model_dir), "--work-dir", str(work),
        "--profiles", "fast", "--epochs", "1000000", "--window-hours", "1", "--no-progress",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no configuration fits the budget" in lines[0]
    assert "fewer epochs would fit: --epochs " in lines[0]
    assert not (work / "optuna.db").exists() and not (work / "mlflow.db").exists()
    assert not (work / CALIBRATION_FILE).exists()


@pytest.fixture(scope="module")
def demo_prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("space")
    config = config_for(work, tiny_model_dir, profiles=None)
    prepared = prepare(config)
    # Unpacked runs only: which profile, epochs or length fits is asked of padded batches here
    # (packing would let the slow profiles fit too; the candidates try every packing).
    domains = {k: v for k, v in prepared.space.domains.items() if k != "packing"}
    return work, dataclasses.replace(
        prepared, space=dataclasses.replace(prepared.space, domains=domains)
    )


def space_estimator(tiny_model_dir: Path, demo_prepared: Any, **overrides: Any) -> StudyEstimator:
    work, prepared = demo_prepared
    config = config_for(work, tiny_model_dir, **overrides)
    return pinned(config, prepared)


def test_suggests_a_faster_profile_first(tiny_model_dir: Path, demo_prepared: Any) -> None:
    # memory_efficient (micro-batch 1-2) is ~8x slower than fast (micro-batch 8-16).
    probe = space_estimator(tiny_model_dir, demo_prepared, epochs=10.0)
    window = math.sqrt(p90_seconds(probe, 16, 2) * p90_seconds(probe, 2, 16))
    estimator = space_estimator(
        tiny_model_dir, demo_prepared, epochs=10.0, profiles=["memory_efficient"],
        window_hours=window / 3600, safety_margin_minutes=0.0,
    )  # fmt: skip
    with pytest.raises(BadInputError, match="a faster profile would fit: --profiles fast"):
        check_space(estimator)


class ProbedEstimator(StudyEstimator):
    """Pessimistic priors until it has measured this machine (a probe that sets the rates)."""

    probed: list[float] = []

    @property
    def calibrated(self) -> bool:
        return bool(self.probed)

    @property
    def coefficients(self) -> Coefficients:
        if self.probed:
            return PINNED
        return dataclasses.replace(PINNED, micro_fixed_seconds=PINNED.micro_fixed_seconds * 1.4)

    def probe(self, seconds: float) -> None:
        self.probed.append(seconds)


FAST = {**TIME_NEUTRAL_PARAMS, "micro_batch_size": 16, "gradient_accumulation_steps": 2,
        "max_length": 128, "lora_r": 4, "gradient_checkpointing": False}  # fmt: skip


def _fast_profile(tiny_model_dir: Path, demo_prepared: Any) -> tuple[StudyConfig, Prepared, Any]:
    """The fast profile's study config, the prepared inputs, and its fastest configuration's
    full run as the measured (pinned) rates predict it."""
    work, prepared = demo_prepared
    config = config_for(work, tiny_model_dir, profiles=("fast",), safety_margin_minutes=0.0)
    return config, prepared, pinned(config, prepared).verdict(FAST).full_run


def _unprobed(
    kind: type[ProbedEstimator], config: StudyConfig, prepared: Prepared, window: float
) -> Any:
    """An estimator of `kind` on its priors (nothing probed yet) for a `window` in seconds."""
    budget = dataclasses.replace(config.budget, window_hours=window / 3600)
    made = kind(
        dataclasses.replace(config, budget=budget),
        prepared,
        model=model_profile(prepared.model_path),
    )
    made.probed = []
    return made


def test_measures_before_refusing_on_priors(tiny_model_dir: Path, demo_prepared: Any) -> None:
    config, prepared, measured = _fast_profile(tiny_model_dir, demo_prepared)
    # A window the measured rates fit and the pessimistic priors' p90 does not.
    window = measured.seconds_p90 * 1.05
    estimator = _unprobed(ProbedEstimator, config, prepared, window)
    guess = estimator.verdict(FAST)
    assert not guess.feasible and guess.full_run.seconds_p10 <= window
    check_space(estimator)  # no error: measured, then it fits
    assert estimator.probed == [PROBE_BEFORE_REFUSING_SECONDS]
    # Calibrated already: no second probe, and a window nothing fits is refused.
    estimator.available_seconds = measured.seconds_p10 / 2
    with pytest.raises(BadInputError, match="no configuration fits"):
        check_space(estimator)
    assert estimator.probed == [PROBE_BEFORE_REFUSING_SECONDS]


def test_the_probe_is_search_time_sized_to_the_search_budget(
    tiny_model_dir: Path, demo_prepared: Any
) -> None:
    config, prepared, measured = _fast_profile(tiny_model_dir, demo_prepared)
    window = measured.seconds_p90 * 1.05
    probed = []
    for hours in (2 / 60, 10.0):
        budget = dataclasses.replace(config.budget, search_hours=hours)
        estimator = _unprobed(
            ProbedEstimator, dataclasses.replace(config, budget=budget), prepared, window
        )
        check_space(estimator)  # measured, then it fits
        probed += estimator.probed
    # 5 % of a 2-minute search; a 10-hour search gets the whole probe, as an unbudgeted one.
    assert probed == [pytest.approx(PROBE_SHARE_OF_SEARCH * 120), PROBE_BEFORE_REFUSING_SECONDS]


class SlowPriorEstimator(ProbedEstimator):
    """Priors three times slower than the machine measures (the CPU priors of a tiny model,
    whose fixed costs dominate, were 1.3-3.3x the probe's): every time coefficient x3."""

    @property
    def coefficients(self) -> Coefficients:
        if self.probed:
            return PINNED
        slow = {
            f: getattr(PINNED, f) * 3.0
            for f in (
                "micro_fixed_seconds", "micro_seconds_per_flop", "micro_seconds_per_adapter_flop",
                "micro_seconds_per_attention_flop", "optimizer_fixed_seconds",
                "eval_fixed_seconds", "eval_seconds_per_flop", "startup_fixed_seconds",
                "checkpoint_fixed_seconds", "loop_seconds_per_micro_step",
            )
        }  # fmt: skip
        return dataclasses.replace(PINNED, **slow)


def test_measures_before_refusing_when_the_priors_are_far_too_slow(
    tiny_model_dir: Path, demo_prepared: Any
) -> None:
    """Priors whose p10 is beyond the window (up to `PRIOR_MAX_PESSIMISM`) are measured
    before a refusal; a window far beyond that is refused unmeasured."""
    config, prepared, measured = _fast_profile(tiny_model_dir, demo_prepared)
    window = measured.seconds_p90 * 1.05
    estimator = _unprobed(SlowPriorEstimator, config, prepared, window)
    guess = estimator.verdict(FAST).full_run
    assert window < guess.seconds_p10 <= PRIOR_MAX_PESSIMISM * window  # the p10 misses it
    check_space(estimator)  # measured, then it fits
    assert estimator.probed == [PROBE_BEFORE_REFUSING_SECONDS]
    hopeless = _unprobed(
        SlowPriorEstimator, config, prepared, guess.seconds_p10 / PRIOR_MAX_PESSIMISM / 2
    )
    with pytest.raises(BadInputError, match="no configuration fits"):
        check_space(hopeless)
    assert hopeless.probed == []


def test_a_window_most_of_the_space_misses_starts_with_configurations_that_fit(
    tiny_model_dir: Path, demo_prepared: Any
) -> None:
    """Under half of the candidates fit: up to `FEASIBLE_STARTS` that fit, in the sampler's
    parameter names, one per profile first; with most of the space fitting, none."""
    probe = space_estimator(tiny_model_dir, demo_prepared, epochs=10.0)
    prepared = probe.prepared  # the space the estimator lets the search propose
    names = prepared.space.profile_names
    p90s = sorted(probe.verdict(p).full_run.seconds_p90 for p in candidates(prepared.space, names))
    window = p90s[len(p90s) // 5]  # about a fifth fits
    estimator = space_estimator(
        tiny_model_dir, demo_prepared, epochs=10.0, profiles=None,
        window_hours=window / 3600, safety_margin_minutes=0.0,
    )  # fmt: skip
    starts = feasible_starts(estimator, names, seed=0)
    assert 1 <= len(starts) <= FEASIBLE_STARTS
    with_fits = {
        p["profile"] for p in candidates(prepared.space, names) if estimator.verdict(p).feasible
    }
    assert len({s["profile"] for s in starts}) == min(len(starts), len(with_fits))
    for start in starts:
        profile = start["profile"]
        flat = {
            **TIME_NEUTRAL_PARAMS, "profile": profile,
            "micro_batch_size": start[f"micro_batch_size@{profile}"],
            "gradient_accumulation_steps": start[f"gradient_accumulation_steps@{profile}"],
            "max_length": prepared.space.profiles[profile].max_length,
            "gradient_checkpointing": prepared.space.profiles[profile].gradient_checkpointing,
            "lora_r": start["lora_r"], "packing": start.get("packing", "none"),
            "quantization": start.get("quantization", "none"),
        }  # fmt: skip
        assert estimator.verdict(flat).feasible, start
    assert (
        feasible_starts(estimator, names, seed=1) != []
        and feasible_starts(
            space_estimator(tiny_model_dir, demo_prepared, profiles=None), names, seed=0
        )
        == []
    )  # a 12 h window: everything fits, the sampler needs no start


def test_suggests_the_most_epochs_that_fit(tiny_model_dir: Path, demo_prepared: Any) -> None:
    estimator = space_estimator(
        tiny_model_dir, demo_prepared, epochs=1000.0, window_hours=0.5, safety_margin_minutes=0.0
    )
    with pytest.raises(BadInputError, match=r"fewer epochs would fit: --epochs ") as info:
        check_space(estimator)
    epochs = float(str(info.value).rsplit("--epochs ", 1)[1].split()[0])
    best = {**TIME_NEUTRAL_PARAMS, "micro_batch_size": 16, "gradient_accumulation_steps": 2}
    # The same run on more GPUs is offered beside it, at the fewest that fit.
    gpus = int(str(info.value).rsplit("--gpus-per-run ", 1)[1].rstrip(")"))
    run = {**best, "max_length": 128, "lora_r": 4, "gradient_checkpointing": False}
    assert estimator.verdict(run, gpus=gpus).feasible
    assert gpus == 2 or not estimator.verdict(run, gpus=gpus // 2).feasible
    assert estimator.verdict({**best, "max_length": 128, "lora_r": 4,
                               "gradient_checkpointing": False}, epochs=epochs).feasible  # fmt: skip
    # Rounded down to two significant digits, so a little more no longer fits.
    assert not estimator.verdict({**best, "max_length": 128, "lora_r": 4,
                                   "gradient_checkpointing": False}, epochs=epochs * 1.1).feasible  # fmt: skip


def test_suggests_a_shorter_max_length(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "long.jsonl"
    data.write_text("".join(f'{{"text": "{"word " * 300}{i}"}}\n' for i in range(60)))
    space = tmp_path / "space.yaml"
    space.write_text(
        "profile: {choice: [only]}\nlearning_rate: 1.0e-3\nlora_r: {choice: [4]}\n"
        "lora_alpha_ratio: 2\nlora_dropout: 0.0\nprofiles:\n  only:\n"
        "    micro_batch_size: [4]\n    gradient_accumulation_steps: [1]\n"
        "    max_length: 512\n    gradient_checkpointing: false\n"
    )
    base = config_for(tmp_path / "w", tiny_model_dir, data=str(data), space=str(space),
                      profiles=None)  # fmt: skip
    prepared = prepare(base)
    probe = pinned(base, prepared)
    params = {**TIME_NEUTRAL_PARAMS, "micro_batch_size": 4, "gradient_accumulation_steps": 1,
              "lora_r": 4, "gradient_checkpointing": False}  # fmt: skip
    # The window decision uses the memory's p90 (an upper bound).
    long = probe.verdict({**params, "max_length": 512}).full_run.peak_memory_bytes_p90
    half = probe.verdict({**params, "max_length": 256}).full_run.peak_memory_bytes_p90
    assert half < long
    limit_gb = (half + long) / 2 / 2**30
    estimator = pinned(
        config_for(tmp_path / "w", tiny_model_dir, data=str(data), space=str(space),
                   profiles=None, max_memory_gb=limit_gb),
        prepared,
    )  # fmt: skip
    with pytest.raises(BadInputError, match="a shorter max_length would fit: 256 tokens") as info:
        check_space(estimator)
    assert "GB limit" in str(info.value)


def test_says_so_when_nothing_helps(tiny_model_dir: Path, demo_prepared: Any) -> None:
    # A 1 s start-up alone does not fit a 0.5 s window.
    estimator = space_estimator(
        tiny_model_dir, demo_prepared, window_hours=0.5 / 3600, safety_margin_minutes=0.0
    )
    with pytest.raises(BadInputError, match="no faster profile, fewer epochs, shorter max_length or more GPUs"):
        check_space(estimator)


def test_something_fits_passes(tiny_model_dir: Path, demo_prepared: Any) -> None:
    check_space(space_estimator(tiny_model_dir, demo_prepared))  # 12 h window: no error


# ----------------------------------------------------------------------------- calibration files


def test_calibration_carries_over_to_the_next_study(tiny_model_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "shared"
    first = run_study(config_for(work, tiny_model_dir, study_name="first"), progress=False)
    assert first.states["complete"] == 2
    after_first = load(work / CALIBRATION_FILE)
    assert after_first.n_measurements["runs"] == 2

    run_study(config_for(work, tiny_model_dir, study_name="second", n_trials=1), progress=False)
    storage = config_for(work, tiny_model_dir).storage_url
    first_trial = optuna.load_study(study_name="first", storage=storage).trials[0]
    second_trial = optuna.load_study(study_name="second", storage=storage).trials[0]
    assert first_trial.user_attrs["time_model_source"].startswith("prior:")
    # The second study's very first check already used the first study's calibration.
    assert second_trial.user_attrs["time_model_source"] == (
        f"calibration:{after_first.calibration_id}"
    )
    assert load(work / CALIBRATION_FILE).n_measurements["runs"] == 3


def test_fingerprint_mismatch_falls_back_to_priors_with_a_warning(
    tiny_model_dir: Path, demo_prepared: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, prepared = demo_prepared
    other = HardwareInfo("cuda", "NVIDIA H100 80GB HBM3", 80 * 2**30, 16, "bf16")
    foreign = fit([], model_profile(tiny_model_dir), other, prior=prior_coefficients(other))
    foreign.save(tmp_path / CALIBRATION_FILE)
    config = config_for(tmp_path, tiny_model_dir)
    with caplog.at_level(logging.WARNING, logger="hpo.calibration_file"):
        estimator = StudyEstimator(config, prepared, cpu_probe=lambda: 1e10)
    assert estimator.calibration is None
    assert estimator.coefficients.source.startswith("prior:")
    warnings = [r for r in caplog.records if r.name == "hpo.calibration_file"]
    assert len(warnings) == 1 and "using priors" in warnings[0].getMessage()
    assert foreign.fingerprint in warnings[0].getMessage()


def test_a_save_is_timed_until_two_adapter_sizes_measured_enough() -> None:
    from tests.test_calibration import runs as synthetic_runs

    run = synthetic_runs()[0]

    def saves(*sizes: int) -> list[Any]:
        return [
            dataclasses.replace(run, trainable_parameters=n, checkpoint_seconds=(0.1,))
            for n in sizes
        ]

    untimed = dataclasses.replace(run, checkpoint_seconds=())
    assert not save_cost_known([])
    assert not save_cost_known(saves(*[1000] * 8))  # one size: the per-parameter term unknown
    assert not save_cost_known(saves(1000, 2000, 1000) + [untimed] * 5)  # too few saves
    assert save_cost_known(saves(1000, 2000, 1000, 1000))
    assert TIMED_SAVES_NEEDED == 4
