"""`python -m analysis.plan`: plans from a config.json alone, for the shipped published configs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from analysis.calibration.file import VERSION, Calibration
from analysis.plan import main
from analysis.planning.fits import (
    RunShape,
    coefficients_for,
    evaluate,
    plan_of_shape,
    same_batch_variants,
)
from analysis.planning.inputs import lengths_from_count, load_model_config, shipped_configs
from analysis.timemodel.gpus import KNOWN_GPUS, find_gpu, peak_of
from analysis.timemodel.hardware import fingerprint, gpu_peak_flops
from analysis.timemodel.machine import config_profile
from analysis.timemodel.model import ModelProfile, memory_breakdown, predict
from common.cli import run_cli
from tests.cli import run_module
from trainers.data.paths import demo_data_path

# Parameter counts the model cards publish (safetensors metadata): the meta-device profile of
# the shipped config.json must count the same.
PUBLISHED_PARAMETERS = {
    "tinyllama-1.1b": 1_100_048_384,
    "phi-3-mini-4k": 3_821_079_552,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    # The models of the published runs `benchmarks/published_runs.py` replays.
    "qwen-1.8b": 1_836_828_672,
    "qwen-7b": 7_721_324_544,
    "qwen-14b": 14_167_290_880,
    "llama-2-7b": 6_738_415_616,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-3b": 3_212_749_824,
    # 70B-class bases, counted by hand from their shapes (embeddings and head untied; Qwen2's
    # q/k/v biases): the cards round them to 70.6B and 72.7B.
    "llama-3.1-70b": 70_553_706_496,
    "qwen2.5-72b": 72_706_203_648,
    # ms-swift's table; their model pages round these to 6.06B and 7.51B.
    "yi-6b": 6_061_035_520,
    "baichuan2-7b": 7_505_973_248,
}
FAMILY_CONFIGS = ("mistral-7b-v0.1", "phi-3-mini-4k", "qwen2.5-7b", "tinyllama-1.1b")
GPUS = ("H100", "A100-80GB", "RTX4090")
LENGTHS = lengths_from_count(10_000, 512)


@pytest.fixture(scope="module")
def profiles() -> dict[str, ModelProfile]:
    return {
        name: config_profile(load_model_config(path)) for name, path in shipped_configs().items()
    }


def plan_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_cli(main, list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_shipped_configs_count_the_published_parameters(profiles: dict[str, ModelProfile]) -> None:
    assert set(profiles) == set(PUBLISHED_PARAMETERS)
    for name, count in PUBLISHED_PARAMETERS.items():
        assert profiles[name].total_parameters == count, name


def test_every_known_gpu_has_a_peak() -> None:
    for gpu in KNOWN_GPUS:
        assert gpu_peak_flops(gpu.device_name, half=gpu.precision != "fp32") == peak_of(gpu)
    assert find_gpu("rtx 4090") == find_gpu("RTX4090")


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_plan_is_finite_and_ordered(name: str, gpu: str, profiles: dict[str, ModelProfile]) -> None:
    spec = find_gpu(gpu)
    coefficients, source = coefficients_for(spec)
    assert source.startswith("priors")
    e = evaluate(RunShape(4, 4, 512, 16), profiles[name], LENGTHS, spec, coefficients).estimate
    values = (e.seconds_p10, e.seconds_p50, e.seconds_p90, e.peak_memory_bytes)
    assert all(math.isfinite(v) and v > 0 for v in values)
    assert e.seconds_p10 <= e.seconds_p50 <= e.seconds_p90
    assert e.peak_memory_bytes <= e.peak_memory_bytes_p90


@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_memory_grows_with_batch_and_length_and_falls_with_checkpointing(
    name: str, profiles: dict[str, ModelProfile]
) -> None:
    gpu = find_gpu("H100")
    coefficients, _ = coefficients_for(gpu)
    lengths = lengths_from_count(10_000, 4096)

    def peak(mb: int, length: int, checkpointing: bool = False) -> int:
        shape = RunShape(mb, 1, length, 16, checkpointing)
        return evaluate(
            shape, profiles[name], lengths, gpu, coefficients
        ).estimate.peak_memory_bytes

    assert peak(1, 512) < peak(2, 512) < peak(8, 512)
    assert peak(4, 256) < peak(4, 512) < peak(4, 2048)
    assert peak(4, 1024, True) < peak(4, 1024)
    # The parts `analysis.plan` shows add up to the predicted peak.
    plan = plan_of_shape(RunShape(4, 2, 1024, 16), profiles[name], lengths, gpu)
    parts = memory_breakdown(plan, coefficients)
    assert sum(parts.values()) == pytest.approx(
        predict(plan, coefficients).peak_memory_bytes, abs=2
    )


def test_cli_plan_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code, stdout, _ = plan_cli(
        capsys, "--model-config", str(shipped_configs()["tinyllama-1.1b"]), "--gpu", "A100-80GB",
        "--samples", "50000", "--max-length", "1024", "--profile", "balanced",
        "--window-hours", "12", "--price-per-hour", "2", "--json", str(out),
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    hours = report["plan"]["duration_hours"]
    assert 0 < hours["p10"] <= hours["p50"] <= hours["p90"]
    assert report["plan"]["cost"]["p50"] == pytest.approx(hours["p50"] * 2)
    assert report["prior_based"] and "priors for A100-80GB" in stdout
    assert report["data"]["train_samples"] == 45_000
    assert report["plan"]["run"]["max_length"] == 1024
    assert set(report["profiles"]) == {"fast", "balanced", "quality", "memory_efficient"}
    gc = report["activations_gib"]
    assert gc["with_gradient_checkpointing"] < gc["without_gradient_checkpointing"]
    assert "fits: yes" in stdout


def test_shipped_name_and_explicit_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = plan_cli(
        capsys, "--model-config", "phi-3-mini-4k", "--gpu", "RTX4090", "--samples", "2000",
        "--micro-batch-size", "64", "--gradient-accumulation-steps", "1", "--max-length", "4096",
    )  # fmt: skip
    assert code == 0
    assert "micro-batch 64 x accumulation 1, max_length 4096" in stdout
    assert "fits: no (out of memory)" in stdout


def test_a_16_bit_base_too_large_for_the_gpu_is_planned_on_nf4_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Mistral-7B's 16-bit base is 13.5 GiB: at 2 x 2,048 tokens it fits a 24 GB GPU neither
    # as asked nor with checkpointing; its NF4 base (3.8 GiB) does.
    run = ["--model-config", "mistral-7b-v0.1", "--gpu", "card24", "--gpu-memory-gb", "24",
           "--gpu-tflops", "120", "--samples", "2000", "--max-length", "2048",
           "--micro-batch-size", "2", "--gradient-accumulation-steps", "8"]  # fmt: skip
    out = tmp_path / "plan.json"
    code, stdout, _ = plan_cli(capsys, *run, "--gpus", "1,2", "--json", str(out))
    assert code == 0
    report = json.loads(out.read_text())
    assert not report["plan"]["fits_memory"]
    assert not report["other_checkpointing"]["fits_memory"]
    nf4 = report["nf4_base"]
    assert nf4["fits_memory"] and nf4["peak_memory_gib_p90"] < report["plan"]["peak_memory_gib_p90"]
    assert nf4["flags"] == "--quantization nf4 --gradient-checkpointing"
    assert f"with an NF4 base ({nf4['flags']}): peak" in stdout
    # Data parallelism copies the base to each GPU: no count fits, for want of memory.
    counts = report["gpu_counts"]
    assert counts["fastest"] is None and "no GPU count fits the memory" in stdout
    assert counts["nf4_base"]["cheapest"] == 1
    # The flags it names give the run it showed.
    code, stdout, _ = plan_cli(capsys, *run, *nf4["flags"].split(), "--json", str(out))
    assert code == 0
    again = json.loads(out.read_text())
    assert again["plan"]["peak_memory_gib_p90"] == pytest.approx(nf4["peak_memory_gib_p90"])
    assert again["plan"]["duration_hours"] == pytest.approx(nf4["duration_hours"])
    assert "nf4_base" not in again and "with an NF4 base" not in stdout
    # Where checkpointing alone makes the 16-bit run fit, that is the remedy shown.
    code, stdout, _ = plan_cli(capsys, *run[:5], "48", *run[6:], "--json", str(out))
    assert code == 0
    roomy = json.loads(out.read_text())
    assert not roomy["plan"]["fits_memory"] and roomy["other_checkpointing"]["fits_memory"]
    assert "nf4_base" not in roomy and roomy["memory_remedy"]["fits_memory"]


@pytest.mark.parametrize(
    ("micro", "accumulation", "micros"), [(4, 4, [4, 2, 1]), (3, 5, [3, 1]), (1, 8, [1])]
)
def test_same_batch_variants_keep_the_effective_batch(
    micro: int, accumulation: int, micros: list[int]
) -> None:
    variants = same_batch_variants(RunShape(micro, accumulation, 2048, 16))
    assert [v.micro_batch_size for v in variants] == [m for m in micros for _ in (0, 1)]
    assert {v.gradient_checkpointing for v in variants} == {False, True}
    assert {v.micro_batch_size * v.gradient_accumulation_steps for v in variants} == {
        micro * accumulation
    }


def _plan_json(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> tuple[dict[str, Any], str]:
    code, stdout, _ = plan_cli(capsys, *args, "--json", str(out))
    assert code == 0
    return json.loads(out.read_text()), stdout


def test_a_run_too_large_for_the_gpu_is_shown_the_fastest_same_batch_run_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Llama-3.1-8B at the default 4 x 4 of 2,048 tokens without checkpointing needs about
    # 160 GiB at p90: no count of H100s holds it, and the plan said only that.
    run = ["--model-config", "llama-3.1-8b", "--gpu", "H100", "--samples", "50000",
           "--tokens-per-sample", "600", "--max-length", "2048"]  # fmt: skip
    out = tmp_path / "plan.json"
    report, stdout = _plan_json(capsys, out, *run, "--gpus", "1,8")
    assert not report["plan"]["fits_memory"] and "nf4_base" not in report
    remedy = report["memory_remedy"]
    assert remedy["fits_memory"] and f"fits the memory with {remedy['flags']}" in stdout
    batch = remedy["run"]["micro_batch_size"] * remedy["run"]["gradient_accumulation_steps"]
    assert batch == 16 and "the same effective batch of 16" in stdout
    # No faster run of the same batch fits: the one with checkpointing toggled among them.
    if report["other_checkpointing"]["fits_memory"]:
        assert remedy["duration_hours"]["p50"] <= report["other_checkpointing"]["duration_hours"]["p50"]
    counts = report["gpu_counts"]
    assert counts["fastest"] is None and "no GPU count fits the memory" in stdout
    assert counts["memory_remedy"]["cheapest"] is not None
    assert f"with {remedy['flags']}: fastest that fits" in stdout
    assert "on 1 GPU (the GPUs table below" in stdout
    # The flags it names give the run it showed, which then needs no remedy.
    again, stdout = _plan_json(capsys, out, *run, *remedy["flags"].split())
    assert again["plan"]["fits_memory"] and "memory_remedy" not in again
    assert again["plan"]["peak_memory_gib_p90"] == pytest.approx(remedy["peak_memory_gib_p90"])
    assert again["plan"]["duration_hours"] == pytest.approx(remedy["duration_hours"])
    assert "fits the memory with" not in stdout and "on 1 GPU" not in stdout


def test_a_70b_base_on_one_h100_is_planned_on_nf4_at_a_micro_batch_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # QLoRA exists for this: a 70B base in NF4 is about 41 GiB. At 4 x 2,048 tokens with
    # checkpointing it still needs about 122 GiB at p90; at 1 x 16 it fits one H100.
    run = ["--model-config", "llama-3.1-70b", "--gpu", "H100", "--samples", "50000",
           "--tokens-per-sample", "600", "--max-length", "2048"]  # fmt: skip
    out = tmp_path / "plan.json"
    report, _ = _plan_json(capsys, out, *run, "--gpus", "1,2")
    assert "memory_remedy" not in report  # no 16-bit run of this batch fits
    nf4 = report["nf4_base"]
    assert nf4["fits_memory"] and nf4["flags"].startswith("--quantization nf4 --micro-batch-size")
    assert nf4["run"]["micro_batch_size"] < 4
    assert report["gpu_counts"]["nf4_base"]["cheapest"] is not None
    same_micro, _ = _plan_json(capsys, out, *run, "--quantization", "nf4", "--gradient-checkpointing")
    assert not same_micro["plan"]["fits_memory"]
    again, _ = _plan_json(capsys, out, *run, *nf4["flags"].split())
    assert again["plan"]["fits_memory"]
    assert again["plan"]["duration_hours"] == pytest.approx(nf4["duration_hours"])


def test_unknown_gpu_described_by_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = plan_cli(
        capsys, "--model-config", "tinyllama-1.1b", "--gpu", "MI300X", "--gpu-tflops", "1307",
        "--gpu-memory-gb", "192", "--samples", "1000",
    )  # fmt: skip
    assert code == 0
    # A GPU without published runs takes the utilisation pooled over all of them.
    assert "priors for MI300X (1307 TFLOP/s bf16 peak; the pooled utilisation" in stdout


def test_data_file_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = demo_data_path("prompt_completion")
    records = sum(1 for line in data.open() if line.strip())
    out = tmp_path / "plan.json"
    code, stdout, _ = plan_cli(
        capsys, "--model-config", "tinyllama-1.1b", "--gpu", "H100", "--data", str(data),
        "--json", str(out),
    )  # fmt: skip
    assert code == 0 and "characters per token" in stdout
    report = json.loads(out.read_text())
    assert report["data"]["train_samples"] == records - round(records * 0.1)
    assert 0 < report["data"]["tokens"] < report["data"]["train_samples"] * 512


@pytest.mark.parametrize(
    ("source", "packing", "varies"),
    [
        ("data", [], True),  # the demo file's samples are of many lengths
        ("data", ["--packing", "padding_free"], False),  # packed rows are always max_length
        ("tokens", [], True),  # a mean under max_length: real samples spread around it
        ("full", [], False),  # every sample max_length
    ],
)
def test_lengths_that_vary_show_the_allocators_share_of_the_peak(
    source: str, packing: list[str], varies: bool, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "plan.json"
    data = {
        "data": ["--data", str(demo_data_path("prompt_completion"))],
        "tokens": ["--samples", "5000", "--tokens-per-sample", "300"],
        "full": ["--samples", "5000"],
    }[source]
    code, stdout, _ = plan_cli(
        capsys, "--model-config", "tinyllama-1.1b", "--gpu", "A100-80GB", *data, *packing,
        "--max-length", "1024", "--json", str(out),
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert report["setup"]["lengths_vary"] is (source != "full")
    share = report["memory_gib"]["varied_length_reserve"]
    assert (share > 0) is varies
    assert ("samples of different lengths:" in stdout) is varies
    assert ("lengths vary, " in stdout) is varies


def test_calibration_measured_on_the_gpu_replaces_the_priors(
    tmp_path: Path, profiles: dict[str, ModelProfile], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = find_gpu("H100")
    prior, _ = coefficients_for(gpu)
    # A calibration that found this GPU twice as fast as the prior assumes (its fixed
    # per-micro-step overhead too: the fitted priors put 100 ms there).
    faster = dataclasses.replace(
        prior,
        micro_fixed_seconds=prior.micro_fixed_seconds / 2,
        micro_seconds_per_flop=prior.micro_seconds_per_flop / 2,
        micro_seconds_per_adapter_flop=prior.adapter_seconds_per_flop / 2,
        micro_seconds_per_attention_flop=prior.micro_seconds_per_attention_flop / 2,
        source="calibrated",
    )
    model = profiles["tinyllama-1.1b"]
    calibration = Calibration(
        version=VERSION, fingerprint=fingerprint(gpu.hardware(), model), hardware=gpu.hardware(),
        model=model, coefficients=faster, prior=prior, n_measurements={"micro_steps": 40},
        created_at="2026-11-23T00:00:00+00:00", calibration_id="test",
    )  # fmt: skip
    calibration.save(tmp_path / "calibration.json")
    args = ("--model-config", "mistral-7b-v0.1", "--samples", "20000", "--max-length", "512",
            "--calibration", str(tmp_path / "calibration.json"))  # fmt: skip

    def p50(gpu_name: str) -> tuple[float, dict[str, Any]]:
        out = tmp_path / f"{gpu_name}.json"
        assert plan_cli(capsys, *args, "--gpu", gpu_name, "--json", str(out))[0] == 0
        report = json.loads(out.read_text())
        return report["plan"]["duration_hours"]["p50"], report

    calibrated, report = p50("H100")
    assert report["coefficients"].startswith("calibration") and not report["prior_based"]
    on_a100, report = p50("A100-80GB")  # measured on another GPU: priors, and it says so
    assert report["prior_based"] and "is for NVIDIA H100 80GB HBM3" in report["coefficients"]
    prior_h100 = evaluate(RunShape(4, 4, 512, 16), profiles["mistral-7b-v0.1"],
                          lengths_from_count(20000, 512), gpu, prior).estimate.seconds_p50  # fmt: skip
    assert calibrated < 0.75 * prior_h100 / 3600


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("{not json", "is not JSON"),
        ('{"hidden_size": 8}', "has no model_type"),
        ('{"model_type": "no-such-arch"}', "'no-such-arch' is not one this transformers knows"),
    ],
)
def test_bad_config_exits_2_with_one_line(
    content: str | None, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    if content is not None:
        config.write_text(content)
    out = tmp_path / "plan.json"
    code, _, stderr = plan_cli(
        capsys, "--model-config", str(config), "--gpu", "H100", "--samples", "100",
        "--json", str(out),
    )  # fmt: skip
    assert code == 2
    assert stderr.count("\n") == 1 and expected in stderr
    assert not out.exists()


def test_unknown_gpu_exits_2_listing_the_known(tmp_path: Path) -> None:
    proc = run_module(
        "analysis.plan", "--model-config", "tinyllama-1.1b",
        "--gpu", "B300", "--samples", "100", "--json", str(tmp_path / "plan.json"),
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "unknown GPU 'B300'" in proc.stderr
    assert all(gpu.name in proc.stderr for gpu in KNOWN_GPUS)
    assert "--gpu-tflops" in proc.stderr
    assert not (tmp_path / "plan.json").exists()


def test_half_described_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, stderr = plan_cli(
        capsys, "--model-config", "tinyllama-1.1b", "--gpu", "X", "--gpu-tflops", "100",
        "--samples", "100",
    )  # fmt: skip
    assert code == 2 and "go together" in stderr


def test_mixture_of_experts_computes_with_its_active_parameters(tmp_path: Path) -> None:
    """Mixtral-8x7B (published: 46.7B parameters, 12.9B active per token): memory holds every
    expert, the matmuls run through two of eight."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
    }))  # fmt: skip
    model = config_profile(load_model_config(config))
    assert model.total_parameters == 46_702_792_704
    assert model.active_parameters == pytest.approx(12.9e9, rel=0.01)
    gpu = find_gpu("H100")
    coefficients, _ = coefficients_for(gpu)
    shape = RunShape(4, 4, 1024, 16)
    lengths = lengths_from_count(5000, 1024)
    moe = evaluate(shape, model, lengths, gpu, coefficients).estimate
    as_dense = evaluate(
        shape, dataclasses.replace(model, active_parameters=0), lengths, gpu, coefficients
    ).estimate
    assert moe.peak_memory_bytes == as_dense.peak_memory_bytes  # every expert is in memory
    ratio = moe.extra["micro_step_seconds"] / as_dense.extra["micro_step_seconds"]
    assert 0.25 < ratio < 0.4  # about 12.9 / 46.7, plus the adapters and attention
    assert fingerprint(gpu.hardware(), model) != fingerprint(
        gpu.hardware(), dataclasses.replace(model, active_parameters=0)
    )


def test_a_split_that_validates_leaves_the_whole_train_split_to_train(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    """`--validation-split`: the study validates on the data's own split, so the full run
    trains on every train record, not on all but a held-out share; a split the data lacks,
    or the flag without --data, is one line and exit 2."""
    folder = tmp_path / "hub"
    folder.mkdir()
    for split, count in (("train", 200), ("validation", 30)):
        rows = ({"prompt": f"What is {i} plus {i}?", "completion": f" {2 * i}"} for i in range(count))
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = ("--model-config", "tinyllama-1.1b", "--gpu", "H100", "--data", str(folder))
    tokenized = ("--tokenizer", str(tiny_model_dir), "--validation-split", "validation")
    for extra, samples in (
        ((), 180), (("--validation-split", "validation"), 200), (tokenized, 200)
    ):  # fmt: skip
        out = tmp_path / f"plan-{len(extra)}.json"
        code, _, _ = plan_cli(capsys, *plan, *extra, "--json", str(out))
        assert code == 0
        assert json.loads(out.read_text())["data"]["train_samples"] == samples
    code, _, err = plan_cli(capsys, *plan, "--validation-split", "dev")
    assert code == 2 and "without a 'dev' split (it has train, validation)" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = plan_cli(
        capsys, "--model-config", "tinyllama-1.1b", "--gpu", "H100", "--samples", "100",
        "--validation-split", "validation",
    )  # fmt: skip
    assert code == 2 and "--validation-split reads --data, which is not given" in err
