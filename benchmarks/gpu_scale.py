"""The plan against the trainer at real scale, on the GPU this runs on (CUDA only).

    python benchmarks/gpu_scale.py [--model-config mistral-7b-v0.1 ...] [--json FILE]

`analysis.plan` predicts a 7B run from published runs (`analysis.priors.fit`); this
measures what `trainers.train`'s own loop does with such a model on this GPU, setup by setup,
and replays each setup through the plan's code exactly as a published row is replayed
(`replay_with`): seconds per optimizer step (p10-p50-p90) and peak memory (p50, p90,
allocated and reserved), next to the measured values.

The model is the shipped config (`analysis/planning/model_configs/`, no weights) with random weights
made on the GPU in bf16 and saved, so that the trainer loads it through its normal path (the
weights' values change neither time nor memory). Its tokens come from the tiny tokenizer
(ids below every shipped vocabulary). Every setup trains `--steps` optimizer steps on rows
packed to max_length (`overflow=pack`, so tokens per sample = max_length, as the published
rows with packing); the first two steps are warm-up. One more setup of the same shape with
`packing=padding_free` (attention kept inside each sample) says whether the trainer's
attention is cheaper there than on whole rows, which the time model must know.

Imports only torch, transformers, peft, numpy, scipy and the project: no optuna or mlflow.
Without CUDA it exits 2 with one line. `--smoke` runs a shrunk config on the CPU, to test the
script itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.priors.fit import replay_with  # noqa: E402
from analysis.priors.fitted import GIB, PublishedPriors, load  # noqa: E402
from analysis.priors.published_runs import PublishedRun  # noqa: E402
from analysis.timemodel.gpus import KNOWN_GPUS  # noqa: E402
from benchmarks._common import machine, table, write_json  # noqa: E402
from benchmarks._held_out import synthetic_data  # noqa: E402
from benchmarks.gpu_check import require_cuda  # noqa: E402
from common.cli import run_cli  # noqa: E402
from common.errors import BadInputError, TrainingFailed  # noqa: E402
from trainers.run_spec import Settings, run_spec  # noqa: E402

WARMUP_STEPS = 2


@dataclasses.dataclass(frozen=True)
class Setup:
    """One measured shape (LoRA on every linear layer, bf16, SDPA, rows packed)."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    gradient_checkpointing: bool
    lora_r: int = 16
    packing: str = "none"  # "padding_free": attention inside each sample
    quantization: str = "none"  # "nf4": the base's linear layers in 4 bits (QLoRA)

    @property
    def label(self) -> str:
        gc = " gc" if self.gradient_checkpointing else ""
        free = " padding-free" if self.packing == "padding_free" else ""
        four = " nf4" if self.quantization == "nf4" else ""
        return (
            f"mb{self.micro_batch_size} ga{self.gradient_accumulation_steps} "
            f"len{self.max_length} r{self.lora_r}{gc}{free}{four}"
        )


SETUPS = (
    Setup(4, 4, 512, False),
    Setup(2, 4, 2048, False),
    Setup(8, 2, 1024, True),
    Setup(1, 8, 4096, True),
    Setup(1, 4, 8192, True),
)
# The same shape as SETUPS[1] with attention kept inside each (short) sample.
PADDING_FREE = dataclasses.replace(SETUPS[1], packing="padding_free")
SMOKE_SETUPS = (
    Setup(2, 2, 64, False),
    Setup(1, 2, 128, True),
    Setup(2, 2, 64, False, packing="padding_free"),
)


def gpu_name_for(device_name: str) -> str:
    """The `analysis.timemodel.gpus` name of the device CUDA reports.

    Raises:
        BadInputError: A GPU the plan does not know.
    """
    for gpu in KNOWN_GPUS:
        if gpu.device_name == device_name:
            return gpu.name
    for gpu in KNOWN_GPUS:  # a variant of a known one ("NVIDIA H200 NVL")
        if device_name.startswith(gpu.device_name + " "):
            return gpu.name
    raise BadInputError(f"the plan knows no GPU named {device_name!r}; known: "
                        f"{', '.join(g.device_name for g in KNOWN_GPUS)}")  # fmt: skip


def planned_row(model: str, gpu: str, setup: Setup, measure: str) -> PublishedRun:
    """A setup nothing has measured yet, as a published row (for the plan's replay alone)."""
    return as_row(model, gpu, setup, {"seconds_per_step": float("nan"), f"{measure}_gib": 0.0},
                  measure)  # fmt: skip


def as_row(
    model: str, gpu: str, setup: Setup, measured: dict[str, Any], measure: str
) -> PublishedRun:
    """A measurement as a published row, so the plan replays it as it replays those."""
    return PublishedRun(
        name=f"{model} {setup.label}",
        source="benchmarks/gpu_scale.py (measured by this project)",
        where="this run",
        model=model,
        gpu=gpu,
        framework="trainers.train (transformers Trainer + PEFT)",
        precision="bf16",
        micro_batch_size=setup.micro_batch_size,
        gradient_accumulation_steps=setup.gradient_accumulation_steps,
        max_length=setup.max_length,
        tokens_per_sample=float(setup.max_length),
        gradient_checkpointing=setup.gradient_checkpointing,
        attention="sdpa",
        packing=True,
        padding_free=setup.packing == "padding_free",
        lora_r=setup.lora_r,
        lora_targets="all-linear",
        logits_fp32=True,
        quantization=setup.quantization,
        time_measure="s/it",
        time_value=measured["seconds_per_step"],
        memory_measure=measure,
        memory_gib=measured[f"{measure}_gib"],
    )


def build_model(config_name: str, out: Path, *, smoke: bool) -> Path:
    """The shipped config with random bf16 weights (made on the GPU) and the tiny tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from analysis.planning.inputs import load_model_config, shipped_configs
    from trainers.tiny import build_tokenizer

    config = load_model_config(shipped_configs()[config_name])
    tokenizer = build_tokenizer()
    if smoke:  # the same architecture, shrunk
        heads = 4
        config.update({"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
                       "num_attention_heads": heads, "num_key_value_heads": 2,
                       "head_dim": 16})  # fmt: skip
    if len(tokenizer) > config.vocab_size:
        raise BadInputError(f"{config_name}: vocabulary {config.vocab_size} < tiny tokenizer's")
    tokenizer.model_max_length = max(s.max_length for s in SMOKE_SETUPS + SETUPS)
    torch.manual_seed(0)
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    if not smoke:
        torch.cuda.empty_cache()
    return out


def measure(
    model: str,
    data: str,
    work: Path,
    setup: Setup,
    steps: int,
    *,
    smoke: bool,
    inputs: Any = None,
    levers: dict[str, Any] | None = None,
    overflow: str | None = None,
) -> dict[str, Any]:
    """Train `steps` optimizer steps of `setup`; median seconds per step after the warm-up.

    `inputs`: a `trainers.loop.inputs.RunInputs` that keeps the base between setups (a 7B
    model loads in tens of seconds). `levers`: the run's speed levers (`trainers.spec`).
    `overflow`: "truncate" keeps unpacked samples apart, each micro-batch padded to its
    longest (default: whole rows, samples joined into blocks of max_length).
    """
    import torch

    from trainers.loop.run import train

    spec = dataclasses.replace(run_spec(
        {"lora_r": setup.lora_r, "lora_dropout": 0.0,
         "micro_batch_size": setup.micro_batch_size,
         "gradient_accumulation_steps": setup.gradient_accumulation_steps,
         "max_length": setup.max_length,
         "gradient_checkpointing": setup.gradient_checkpointing,
         "packing": setup.packing, "quantization": setup.quantization},
        Settings(work_dir=work, eval_interval=0, eval_samples=1, checkpoint_interval=0,
                 device="cpu" if smoke else "cuda", precision="fp32" if smoke else "bf16"),
        model=model, data=data, output_dir=work / "out", max_steps=steps,
    ), overflow=overflow or ("truncate" if setup.packing == "padding_free" else "pack"),
        **(levers or {}))  # fmt: skip
    if not smoke:  # reserved is the allocator's cache: start each setup from an empty one
        # A 4-bit base no longer used lives on in a cycle (bitsandbytes' Params4bit refers to
        # its Linear4bit), and an out-of-memory's traceback holds the activations: collect
        # them first, or the next setup's peak counts them.
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    result = train(spec, inputs=inputs)
    reserved = 0 if smoke else int(torch.cuda.max_memory_reserved())
    step_seconds = result.step_seconds[WARMUP_STEPS:] or result.step_seconds
    ga = setup.gradient_accumulation_steps
    tokens = [
        sum(result.micro_step_tokens[i * ga : (i + 1) * ga]) for i in range(result.optimizer_steps)
    ]
    return {
        "setup": setup.label,
        "steps": result.optimizer_steps,
        "seconds_per_step": statistics.median(step_seconds),
        "step_seconds": result.step_seconds,
        "tokens_per_step": statistics.median(tokens[WARMUP_STEPS:] or tokens),
        "tokens_per_second": sum(tokens[WARMUP_STEPS:]) / sum(step_seconds),
        "first_loss": result.train_losses[0][1] if result.train_losses else None,
        "last_loss": result.train_losses[-1][1] if result.train_losses else None,
        "allocated_gib": result.peak_memory_bytes / GIB,
        "reserved_gib": reserved / GIB,
        "runtime": result.runtime_reason,
    }


def compare(
    model: str,
    gpu: str,
    setup: Setup,
    measured: dict[str, Any],
    priors: PublishedPriors,
    cache: dict,
) -> dict[str, Any]:
    """The plan's replay of one measured setup, with errors and whether the band holds it."""
    out: dict[str, Any] = {}
    for measure_kind in ("allocated", "reserved"):
        row = as_row(model, gpu, setup, measured, measure_kind)
        plan = replay_with(row, priors, cache)
        if measure_kind == "allocated":
            out.update(
                plan_seconds_p10=plan.seconds_p10, plan_seconds_p50=plan.seconds_p50,
                plan_seconds_p90=plan.seconds_p90,
                seconds_error_pct=100 * (plan.seconds_p50 / row.seconds_per_step - 1),
                seconds_inside=plan.seconds_p10 <= row.seconds_per_step <= plan.seconds_p90,
            )  # fmt: skip
        out[f"plan_{measure_kind}_p50_gib"] = plan.memory_p50_gib
        out[f"plan_{measure_kind}_p90_gib"] = plan.memory_p90_gib
        out[f"{measure_kind}_below_p90"] = row.memory_gib <= plan.memory_p90_gib
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", nargs="+", default=["mistral-7b-v0.1"],
                        help="shipped configs (analysis/planning/model_configs) to measure")  # fmt: skip
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per setup")
    parser.add_argument("--json", default="gpu-scale.json", help="results file")
    parser.add_argument("--budget-minutes", type=float, default=9.0, help="skip what would overrun")
    parser.add_argument("--smoke", action="store_true", help="shrunk config on the CPU")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import torch

    require_cuda(args.smoke or torch.cuda.is_available(),
                 f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU")  # fmt: skip
    gpu = "H100" if args.smoke else gpu_name_for(torch.cuda.get_device_name(0))
    setups = SMOKE_SETUPS if args.smoke else (*SETUPS, PADDING_FREE)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    cache: dict = {}
    priors = load()  # before any GPU time is spent
    if priors is None:
        raise BadInputError(
            "no published priors stored: run python -m benchmarks.published_runs --write-priors"
        )
    with tempfile.TemporaryDirectory(prefix="gpu-scale-") as tmp:
        work = Path(tmp)
        data = str(synthetic_data(work / "data.jsonl", samples=300 if args.smoke else 6000))
        for name in args.model_config:
            model_dir = work / name
            built = time.perf_counter()
            build_model(name, model_dir, smoke=args.smoke)
            print(f"{name}: built and saved in {time.perf_counter() - built:.0f} s", flush=True)
            for setup in setups:
                if time.perf_counter() - started > args.budget_minutes * 60:
                    skipped.append(f"{name} {setup.label}")
                    continue
                try:
                    measured = measure(
                        str(model_dir), data, work, setup, args.steps, smoke=args.smoke
                    )
                except TrainingFailed as exc:  # out of memory: a finding, not a crash
                    rows.append(
                        {
                            "model": name,
                            "setup": setup.label,
                            "error": str(exc).splitlines()[0][:300],
                        }
                    )
                    torch.cuda.empty_cache()
                    continue
                row = {
                    "model": name,
                    **measured,
                    **compare(name, gpu, setup, measured, priors, cache),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            shutil.rmtree(model_dir, ignore_errors=True)
    results = {"gpu": gpu, "rows": rows, "skipped": skipped,
               "seconds": time.perf_counter() - started, "machine": machine()}  # fmt: skip
    print_report(results)
    write_json(args.json, results)
    return 0


def print_report(results: dict[str, Any]) -> None:
    done = [r for r in results["rows"] if "error" not in r]
    print(f"\n{results['gpu']}: seconds per optimizer step and peak GiB, measured against the plan")
    print(table(
        ["model", "setup", "tok/s", "s/step", "plan p10-p50-p90", "err %", "in",
         "alloc GiB", "plan p50/p90", "reserved GiB", "plan p50/p90 "],
        [[r["model"], r["setup"], round(r["tokens_per_second"]), round(r["seconds_per_step"], 3),
          f"{r['plan_seconds_p10']:.2f}-{r['plan_seconds_p50']:.2f}-{r['plan_seconds_p90']:.2f}",
          round(r["seconds_error_pct"], 1), "yes" if r["seconds_inside"] else "no",
          round(r["allocated_gib"], 1),
          f"{r['plan_allocated_p50_gib']:.1f}/{r['plan_allocated_p90_gib']:.1f}",
          round(r["reserved_gib"], 1),
          f"{r['plan_reserved_p50_gib']:.1f}/{r['plan_reserved_p90_gib']:.1f}"] for r in done],
    ))  # fmt: skip
    for r in results["rows"]:
        if "error" in r:
            print(f"{r['model']} {r['setup']}: {r['error']}")
    if results["skipped"]:
        print(f"skipped (time budget): {', '.join(results['skipped'])}")


if __name__ == "__main__":
    sys.exit(run_cli(main))
