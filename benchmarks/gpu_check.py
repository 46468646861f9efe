"""One command for a CUDA machine: is the framework fast there, and is the time model right?

    python benchmarks/gpu_check.py [--json FILE] [--budget-minutes 7.5]

In about 5-8 minutes on one GPU, side by side in one process, it measures:

1. `trainers.loop.run.train` against a bare PyTorch loop in bf16 (tokens/s, alternating;
   the comparison of `benchmarks/trainer_throughput.py`);
2. the model FLOPs utilisation (MFU) of the LoRA step against the GPU's dense bf16 peak
   (the FLOPs of `analysis.timemodel.model`: 4N per token for frozen weights, 6P for adapters);
3. the time model, calibrated by the probe design, on held-out configurations: duration
   (p50 and p10-p90) and peak memory (p50 and p90) against what they measured;
4. torch.compile on against off (last, skipped when the budget is spent).

The model is a ~270 M-parameter llama built locally (no hub) with the tiny tokenizer.
Writes JSON and prints tables. Imports only torch, transformers, peft, numpy, scipy and the
project's trainers/analysis/common packages: no optuna or mlflow. Without a CUDA device it
exits 2 with one line. `--smoke` runs every step at toy size on the CPU, to test the script
itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.calibrate import PROBE_DESIGN  # noqa: E402
from analysis.timemodel.hardware import cpu_matmul_flops, gpu_peak_flops  # noqa: E402
from analysis.timemodel.machine import model_profile  # noqa: E402
from analysis.timemodel.model import ModelProfile  # noqa: E402
from analysis.timemodel.workload import adapter_flops, attention_flops, frozen_flops  # noqa: E402
from benchmarks._common import machine, median, table, write_json  # noqa: E402
from benchmarks._held_out import HELD_OUT, calibrate, synthetic_data  # noqa: E402
from benchmarks.time_model_accuracy import (  # noqa: E402
    held_out_row,
    reserved_above_bound_fraction,
)
from benchmarks.time_model_refit import raw_payload  # noqa: E402
from benchmarks.trainer_throughput import (  # noqa: E402
    bare_tokens_per_second,
    framework_tokens_per_second,
)
from common.cli import run_cli  # noqa: E402
from common.errors import BadInputError  # noqa: E402
from trainers.run_spec import Settings, run_spec  # noqa: E402
from trainers.spec import TrainSpec  # noqa: E402

# (hidden, layers, heads, intermediate, positions): a 270 M llama; the toy for --smoke.
GPU_DIMS = (1024, 16, 16, 4096, 2048)
SMOKE_DIMS = (64, 2, 4, 256, 512)


def require_cuda(cuda_available: bool, detail: str) -> None:
    """Stop with exit code 2 (one line) when there is no CUDA device."""
    if not cuda_available:
        raise BadInputError(f"no CUDA device: {detail}; run this on a GPU machine")


def flops_per_token(
    profile: ModelProfile, lora_r: int, seq_len: int, *, attention: bool = False
) -> float:
    """Training FLOPs per token of a LoRA step (no recomputation), as the time model counts."""
    trainable = lora_r * profile.lora_parameters_per_rank
    flops = frozen_flops(profile.total_parameters, 1.0, False)
    flops += adapter_flops(trainable, 1.0, False)
    if attention:  # b * s^2 over b * s tokens = s per token
        flops += attention_flops(profile, float(seq_len), False)
    return flops


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's dense peak."""
    if not peak_flops:
        return None
    return tokens_per_second * flops_per_token / peak_flops


def build_model(out: Path, dims: tuple[int, int, int, int, int]) -> Path:
    """A randomly initialised llama of `dims` with the tiny tokenizer, saved to `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainers.tiny import build_config, build_tokenizer

    hidden, layers, heads, intermediate, positions = dims
    tokenizer = build_tokenizer()
    tokenizer.model_max_length = positions
    config = build_config("llama", "s", tokenizer)
    config.update(
        {
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "intermediate_size": intermediate,
            "max_position_embeddings": positions,
            "initializer_range": 0.02,
        }
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def throughput(spec: TrainSpec, repeats: int) -> dict[str, Any]:
    """Trainer and bare loop, alternating (drift hits both alike); median of the ratios."""
    trainer: list[float] = []
    bare: list[float] = []
    for repeat in range(repeats):
        if repeat % 2 == 0:
            trainer.append(framework_tokens_per_second(spec))
            bare.append(bare_tokens_per_second(spec))
        else:
            bare.append(bare_tokens_per_second(spec))
            trainer.append(framework_tokens_per_second(spec))
    ratios = [t / b for t, b in zip(trainer, bare, strict=True)]
    return {"trainer_tokens_per_second": trainer, "bare_tokens_per_second": bare,
            "ratios": ratios, "ratio": median(ratios)}  # fmt: skip


def compile_check(spec: TrainSpec) -> dict[str, Any]:
    """Trainer tokens/s with torch.compile off and on (compile time is in the warm-up)."""
    off = framework_tokens_per_second(spec)
    try:
        on = framework_tokens_per_second(dataclasses.replace(spec, compile=True))
    except Exception as exc:  # a compiler failure is a finding, not a crash of the check
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return {"off_tokens_per_second": off, "on_tokens_per_second": None, "error": first}
    return {"off_tokens_per_second": off, "on_tokens_per_second": on, "speedup": on / off}


def time_model(
    model: str, data: str, work: Path, *, smoke: bool, raw: str | None = None
) -> dict[str, Any]:
    """Calibrate with the probe design, then predict and train held-out configurations.

    `raw`: also write what the runs measured there, for `benchmarks.time_model_refit`.
    """
    design = PROBE_DESIGN[:4] if smoke else PROBE_DESIGN
    probes = calibrate(model, data, work, design)
    factor = 1.5 if smoke else 5.0
    rows = [
        held_out_row(model, data, work, probes, index, config, factor)
        for index, config in enumerate(HELD_OUT[: 2 if smoke else 3])
    ]
    if raw:
        write_json(raw, raw_payload(probes["hardware"], probes["results"], rows))
    for row in rows:
        row.pop("result")
    return {
        "probe_runs": probes["runs"],
        "probe_seconds": probes["seconds"],
        "calibration": probes["calibration"].coefficients.to_dict(),
        "median_abs_pct_error": median([r["abs_pct_error"] for r in rows]),
        "band_coverage": sum(r["inside_band"] for r in rows) / len(rows),
        "memory_median_abs_pct_error": median([r["memory_abs_pct_error"] for r in rows]),
        "memory_above_p90_fraction": sum(r["memory_above_p90"] for r in rows) / len(rows),
        "reserved_above_bound_fraction": reserved_above_bound_fraction(rows),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="gpu-check.json", help="results file")
    parser.add_argument("--budget-minutes", type=float, default=7.5, help="skip what would overrun")
    parser.add_argument("--smoke", action="store_true", help="toy size on CPU (tests the script)")
    parser.add_argument(
        "--raw", help="also write the time model's measured runs (benchmarks.time_model_refit)"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import torch

    require_cuda(
        args.smoke or torch.cuda.is_available(),
        f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU",
    )
    device = "cpu" if args.smoke else "cuda"
    name = "cpu" if args.smoke else torch.cuda.get_device_name(0)
    peak = cpu_matmul_flops() if args.smoke else gpu_peak_flops(name, half=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        model = str(build_model(work / "model", SMOKE_DIMS if args.smoke else GPU_DIMS))
        data = str(synthetic_data(work / "data.jsonl"))
        spec = dataclasses.replace(run_spec(
            {"lora_r": 16, "lora_dropout": 0.0, "micro_batch_size": 2 if args.smoke else 8,
             "gradient_accumulation_steps": 1, "max_length": 64 if args.smoke else 1024},
            Settings(work_dir=work, eval_interval=0, eval_samples=1, device=device,
                     precision="fp32" if args.smoke else "bf16"),
            model=model, data=data, output_dir=work / "out", max_steps=6 if args.smoke else 30,
        ), overflow="pack")  # fmt: skip
        results: dict[str, Any] = {"device": name, "peak_flops": peak}
        results["throughput"] = speed = throughput(spec, 2)
        profile = model_profile(model)
        rates = {
            "mfu": flops_per_token(profile, spec.lora.r, spec.max_length),
            "mfu_with_attention": flops_per_token(
                profile, spec.lora.r, spec.max_length, attention=True
            ),
        }
        best = max(speed["trainer_tokens_per_second"])
        results["mfu"] = {key: mfu(best, flops, peak) for key, flops in rates.items()}
        results["mfu"]["base_parameters"] = profile.total_parameters
        results["time_model"] = time_model(
            model, data, work / "time-model", smoke=args.smoke, raw=args.raw
        )
        if time.perf_counter() - started < (args.budget_minutes - 2.0) * 60:
            results["compile"] = compile_check(spec)
        else:
            results["compile"] = {"skipped": "time budget spent"}
    results["seconds"] = time.perf_counter() - started
    results["machine"] = machine()
    print_report(results)
    write_json(args.json, results)
    return 0


def print_report(results: dict[str, Any]) -> None:
    speed, util, model = results["throughput"], results["mfu"], results["time_model"]
    peak = results["peak_flops"]
    print(f"\n{results['device']}: dense bf16 peak "
          f"{f'{peak / 1e12:.0f} TFLOP/s' if peak else 'unknown (not in the table)'}")  # fmt: skip
    print(table(["repeat", "trainer tok/s", "bare loop tok/s", "ratio"],
                [[i + 1, t, b, r] for i, (t, b, r) in enumerate(zip(
                    speed["trainer_tokens_per_second"], speed["bare_tokens_per_second"],
                    speed["ratios"], strict=True))]))  # fmt: skip
    shown = {k: "n/a" if v is None else f"{100 * v:.1f} %" for k, v in util.items() if "mfu" in k}
    print(f"trainer / bare (median) {speed['ratio']:.3f}; MFU {shown['mfu']} "
          f"({shown['mfu_with_attention']} counting attention)")  # fmt: skip
    compiled = results["compile"]
    if compiled.get("speedup"):
        print(f"torch.compile: {compiled['speedup']:.2f}x ({compiled['off_tokens_per_second']:,.0f}"
              f" -> {compiled['on_tokens_per_second']:,.0f} tok/s)")  # fmt: skip
    else:
        print(f"torch.compile: {compiled.get('error') or compiled.get('skipped')}")
    print(table(["config", "pred p50 s", "p10-p90 s", "measured s", "err %", "in band",
                 "mem p50 MB", "mem p90 MB", "mem meas MB"],
                [[r["config"], r["predicted_p50_s"],
                  f"{r['predicted_p10_s']:.1f}-{r['predicted_p90_s']:.1f}", r["measured_s"],
                  r["abs_pct_error"], "yes" if r["inside_band"] else "no",
                  r["predicted_memory_mb"], r["predicted_memory_p90_mb"], r["measured_memory_mb"]]
                 for r in model["rows"]]))  # fmt: skip
    print(f"time model: median |error| {model['median_abs_pct_error']:.1f} %, inside p10-p90 "
          f"{100 * model['band_coverage']:.0f} %, memory above p90 "
          f"{100 * model['memory_above_p90_fraction']:.0f} % ({results['seconds']:.0f} s in all)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(run_cli(main))
