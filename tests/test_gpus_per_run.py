"""A study whose full run trains on N GPUs (`budget.gpus_per_run`): its trials train on one
GPU with the same effective batch and steps, the window, memory and cost are judged for the
full run on N (hand-computed below), the search budget counts GPU-hours, and the preset
carries N and the command that starts it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.search.schedule import plan_search_for_run
from analysis.timemodel.hardware import HardwareInfo
from analysis.timemodel.interconnect import LINKS
from analysis.timemodel.model import Coefficients, Estimate, ModelProfile
from hpo.config import StudyConfig, load_config
from hpo.estimator import StudyEstimator
from hpo.export import write_preset
from hpo.prepare import Prepared
from hpo.trial_runs import full_run, on_one_gpu, trial_runs
from hpo.what_fits import TIME_NEUTRAL_PARAMS
from search_spaces import load_space
from tests.cli import run_module
from trainers.data.dataset import DatasetStats
from trainers.preset import launch_command, launch_note, load_preset, preset_dict
from trainers.spec import optimizer_steps

# One micro-step costs exactly 1 s; nothing else costs anything but the all-reduce, and the
# band is closed (p10 = p50 = p90), so every duration below is counted by hand.
ONE_SECOND_STEPS = Coefficients(
    micro_fixed_seconds=1.0,
    micro_seconds_per_flop=0.0,
    micro_seconds_per_attention_flop=0.0,
    optimizer_fixed_seconds=0.0,
    optimizer_seconds_per_parameter=0.0,
    eval_fixed_seconds=0.0,
    eval_seconds_per_flop=0.0,
    checkpoint_fixed_seconds=0.0,
    checkpoint_seconds_per_parameter=0.0,
    startup_fixed_seconds=0.0,
    startup_seconds_per_parameter=0.0,
    data_seconds_per_token=0.0,
    memory_fixed_bytes=2**30,
    eval_seconds_per_batch=0.0,
    systematic_log_p10=0.0,
    systematic_log_p90=0.0,
    memory_log_p90=0.0,
    source="hand",
)
# 10M parameters, 2 layers of 64, a vocabulary of 1000; 1M LoRA parameters per rank.
MODEL = ModelProfile(10_000_000, 2, 64, 1000, 1_000_000)
TRAIN_SAMPLES = 1000
PARAMS = {
    **TIME_NEUTRAL_PARAMS,
    "profile": "fast",
    "micro_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "max_length": 64,
    "gradient_checkpointing": False,
    "lora_r": 8,
    "packing": "none",
    "quantization": "none",
}


class HandEstimator(StudyEstimator):
    @property
    def coefficients(self) -> Coefficients:
        return ONE_SECOND_STEPS


def _config(device: str = "auto", **budget: Any) -> StudyConfig:
    return load_config(
        None,
        {
            "work_dir": "unused",
            "device": device,
            "trial_fraction": 0.25,
            "full_eval_interval": 1000,
            "full_checkpoint_interval": 0,
            "budget": {"safety_margin_minutes": 0.0, **budget},
        },
    )


def _estimator(config: StudyConfig) -> HandEstimator:
    lengths = [64] * (TRAIN_SAMPLES + 50)  # 50 validation samples after the train ones
    stats = DatasetStats("text", len(lengths), 64 * len(lengths), 64.0, 64, 64, 64, 0, 0, lengths)
    prepared = Prepared(
        model_path="unused",
        data_path="unused",
        space=load_space(),
        train_samples=TRAIN_SAMPLES,
        dataset_stats={64: stats},
        eval_max_length=64,
    )
    hardware = HardwareInfo("cuda", "test GPU", 80 * 2**30, 8, "bf16")
    return HandEstimator(config, prepared, hardware=hardware, model=MODEL)


def test_the_trial_trains_on_one_gpu_at_its_full_runs_batch_and_steps() -> None:
    config = _config(gpus_per_run=4)
    runs = trial_runs(config, PARAMS, model="m", data="d", train_samples=1000)
    full, trial = runs.full_run, runs.trial
    assert (full.gpus, full.micro_batch_size, full.gradient_accumulation_steps) == (4, 4, 2)
    assert (trial.gpus, trial.micro_batch_size, trial.gradient_accumulation_steps) == (1, 4, 8)
    assert trial.effective_batch_size == full.effective_batch_size == 32
    # The same steps for any data size: ceil(ceil(S / 16) / 2) on 4 GPUs, ceil(ceil(S / 4) / 8)
    # on one; 1000 samples make 32 steps (ceil(1000 / 32)), a quarter of them 8.
    for samples in (1, 31, 32, 33, 999, 1000, 1001, 4097):
        assert optimizer_steps(full, samples) == optimizer_steps(on_one_gpu(full), samples)
    assert optimizer_steps(full, 1000) == 32 and trial.stop_after_steps == 8
    assert on_one_gpu(on_one_gpu(full)) == on_one_gpu(full)


@pytest.mark.parametrize(
    ("gpus", "full_seconds", "fits", "trial_seconds"),
    [
        # One GPU: ceil(1000 / 4) = 250 micro-steps of 1 s; the 100 s window is too short.
        # Its trial: round(0.25 x 125 steps) = 31 steps of 2 micro-steps.
        (1, 250.0, False, 62.0),
        # Four GPUs: ceil(1000 / 16) = 63 micro-batches each, 32 steps of 2 micro-steps, plus
        # 32 all-reduces of 8M fp32 gradients on NVLink: 2 ms + 2 x 3/4 x 32 MB / 300 GB/s.
        # Its trial, on one GPU: 8 of the 32 steps, of 2 x 4 micro-steps each.
        (4, 64.0 + 32 * (2e-3 + 1.5 * 32e6 / 3e11), True, 64.0),
    ],
)
def test_the_window_check_judges_the_full_run_on_its_gpus(
    gpus: int, full_seconds: float, fits: bool, trial_seconds: float
) -> None:
    estimator = _estimator(_config(gpus_per_run=gpus, window_hours=100 / 3600, price_per_hour=2))
    verdict = estimator.verdict(PARAMS)
    full = verdict.full_run
    assert full.gpus == gpus
    assert full.seconds_p50 == pytest.approx(full_seconds, rel=1e-9)
    assert full.seconds_p90 == pytest.approx(full_seconds, rel=1e-9)
    assert verdict.feasible is fits
    assert verdict.constraints["duration"] == pytest.approx(full_seconds / 100 - 1)
    # Every GPU is paid for the whole run.
    assert full.cost(2.0)["p50"] == pytest.approx(gpus * 2.0 * full_seconds / 3600)
    assert verdict.trial_run.gpus == 1
    assert verdict.trial_run.seconds_p50 == pytest.approx(trial_seconds)
    section = estimator.describe(full)
    assert section["gpus"] == gpus
    assert section["gpu_hours_p50"] == pytest.approx(gpus * full_seconds / 3600)


def test_memory_is_judged_per_gpu_with_ddps_buckets() -> None:
    one = _estimator(_config(gpus_per_run=1)).verdict(PARAMS).full_run
    four = _estimator(_config(gpus_per_run=4)).verdict(PARAMS).full_run
    # Same micro-batch on each GPU; DDP adds one fp32 gradient bucket of the 8M adapter.
    assert four.peak_memory_bytes - one.peak_memory_bytes == 4 * 8_000_000


def test_the_budgets_link_sets_the_all_reduce() -> None:
    slow = _estimator(_config(gpus_per_run=4, interconnect="pcie4")).verdict(PARAMS).full_run
    link = LINKS["pcie4"]
    allreduce = link.step_seconds + 1.5 * 32e6 / link.bus_bytes_per_second
    assert slow.seconds_p50 == pytest.approx(64.0 + 32 * allreduce)


def _estimate(seconds: float, gpus: int) -> Estimate:
    return Estimate(
        seconds_p10=seconds, seconds_p50=seconds, seconds_p90=seconds,
        breakdown={"train": seconds}, tokens_per_second=1.0, peak_memory_bytes=1,
        peak_memory_bytes_p90=1, optimizer_steps=100, micro_steps=100, n_evaluations=0,
        n_checkpoints=0, train_tokens=1.0, gpus=gpus,
    )  # fmt: skip


def test_the_search_budget_is_a_share_of_the_full_runs_gpu_hours() -> None:
    # The full run: 2 h on 4 GPUs = 8 GPU-hours; on the trials' one GPU 7.6 h of work.
    full, one_gpu = _estimate(2 * 3600, 4), _estimate(7.6 * 3600, 1)
    plan = plan_search_for_run(
        full, one_gpu=one_gpu, search_hours=None, search_budget_pct=25, n_trials=4,
        max_fidelity=0.05, evals=1, price_per_hour=3.0, reuse_base_model=True,
    )  # fmt: skip
    assert plan.budget_hours == pytest.approx(2.0)  # 25 % of 8 GPU-hours
    assert plan.full_run_hours_p50 == pytest.approx(8.0)
    assert plan.trial_hours == pytest.approx(0.05 * 7.6)  # a share of the one-GPU work
    assert plan.to_dict()["full_run_cost_p50"] == pytest.approx(24.0)  # 4 x 3.0 x 2 h
    assert "p50 8.0 h of GPU time (4 GPUs x 2.0 h)" in "\n".join(plan.lines())


def test_the_preset_carries_its_gpus_and_the_command_that_starts_them(tmp_path: Path) -> None:
    config = _config(gpus_per_run=4)
    full = full_run(config, PARAMS, model=str(tmp_path), data=str(tmp_path / "d.jsonl"))
    path = write_preset(preset_dict(full, estimate={}, provenance={}), tmp_path / "p s.yaml")
    text = path.read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    command = f"python -m trainers.train --preset '{path}'"
    assert raw["training"]["gpus"] == 4 and raw["training"]["gradient_accumulation_steps"] == 2
    assert raw["launch"]["command"] == command == launch_command(path)
    assert raw["launch"]["gpus"] == 4
    assert "starts 4 processes through torchrun" in raw["launch"]["runs"]
    assert text.splitlines()[0] == f"# hpo preset: run it with  {command}"
    assert load_preset(path).spec.gpus == 4  # what trainers.train --preset then launches
    one = write_preset(
        preset_dict(dataclasses.replace(full, gpus=1), estimate={}, provenance={}),
        tmp_path / "one.yaml",
    )
    assert yaml.safe_load(one.read_text(encoding="utf-8"))["launch"]["runs"] == "runs on 1 GPU"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--gpus-per-run", "0"), "budget.gpus_per_run must be >= 1, but got gpus_per_run=0"),
        (("--interconnect", "infiniband"), "budget.interconnect must be one of nvlink"),
    ],
)
def test_a_bad_gpus_per_run_exits_2_with_one_line(
    tmp_path: Path, args: tuple[str, ...], line: str
) -> None:
    result = run_module("hpo.study", "--work-dir", tmp_path / "work", *args, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and line in lines[0]
    assert not (tmp_path / "work").exists()


def test_a_fractional_gpus_per_run_in_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text("budget:\n  gpus_per_run: 2.5\n", encoding="utf-8")
    result = run_module("hpo.study", "--config", path, "--work-dir", tmp_path / "w", timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "budget.gpus_per_run must be an integer >= 1, but got budget.gpus_per_run=2.5"
    )


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("auto", "on 4 GPUs (it starts 4 processes through torchrun; CUDA_VISIBLE_DEVICES must"),
        ("cpu", "on 4 CPU processes (gloo, started through torchrun)"),
    ],
)
def test_the_summarys_train_it_line_is_the_presets_command(
    device: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpo.summary import StudySummary, print_summary

    summary = StudySummary(
        study_name="s", states={"complete": 1, "pruned": 0, "failed": 0}, best_value=4.5,
        best_params={}, best_trial=3, best_estimate={"gpus": 4, "duration_hours": {"p50": 2.0}},
        preset_path="p.yaml", mlflow_experiment_id="1", mlflow_parent_run_id="r",
        elapsed_seconds=1.0, tracking_uri="off",
        launch_note=launch_note(_config(gpus_per_run=4, device=device).gpus, device),
    )  # fmt: skip
    print_summary(summary, {})
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("train it"))
    assert line.startswith(f"train it {says}")
    assert line.endswith(f": {launch_command('p.yaml')}")
    assert "full run on 4 GPUs: 2.0 h predicted" in out
