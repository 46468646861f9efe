"""tokens/s of `trainers.loop.run.train` against a bare PyTorch loop, side by side.

Same tiny model, data (packed into equal-length blocks), micro-batch, accumulation,
device and precision (as `trainers.model.runtime` resolves them: bf16 autocast, TF32 and fused
AdamW on a recent GPU), optimizer (AdamW), gradient clipping and linear schedule. The two
alternate within one process run; tokens/s counts the padded tokens of the optimizer steps
after warm-up over their wall time. `benchmarks/gpu_check.py` runs the same comparison on a
GPU.

    python benchmarks/trainer_throughput.py [--json FILE] [--repeats 3] [--steps 40] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, table, write_results  # noqa: E402
from trainers.data.dataset import load_tokenized  # noqa: E402
from trainers.data.paths import demo_data_path  # noqa: E402
from trainers.loop.run import train  # noqa: E402
from trainers.loop.trainer_setup import PadCollator  # noqa: E402
from trainers.model.lora import apply_lora, load_base_model, load_tokenizer  # noqa: E402
from trainers.model.runtime import detect_runtime  # noqa: E402
from trainers.run_spec import Settings, run_spec  # noqa: E402
from trainers.spec import TrainSpec  # noqa: E402
from trainers.tiny import default_tiny_model  # noqa: E402

WARMUP_STEPS = 3


def framework_tokens_per_second(spec: TrainSpec) -> float:
    result = train(spec)
    ga = spec.gradient_accumulation_steps
    tokens = [
        sum(result.micro_step_tokens[i * ga : (i + 1) * ga]) for i in range(result.optimizer_steps)
    ]
    return sum(tokens[WARMUP_STEPS:]) / sum(result.step_seconds[WARMUP_STEPS:])


def bare_tokens_per_second(spec: TrainSpec) -> float:
    """The same training written as the plainest PyTorch loop, on the trainer's device set-up."""
    from transformers import get_linear_schedule_with_warmup, set_seed

    runtime = detect_runtime(spec.device, spec.precision, spec.compile)
    device = torch.device(runtime.device)
    cuda = runtime.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = runtime.tf32
        torch.backends.cudnn.allow_tf32 = runtime.tf32
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(runtime.precision)
    set_seed(spec.seed)
    tokenizer = load_tokenizer(spec.model)
    data = load_tokenized(spec.data_spec(), tokenizer)
    model, _ = apply_lora(load_base_model(spec.model), spec.lora)
    model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=spec.learning_rate,
        weight_decay=spec.weight_decay,
        fused=runtime.fused_adamw or None,
    )
    forward = torch.compile(model) if runtime.compile else model
    # fp16 needs a gradient scaler, which this plain loop leaves out: compare in bf16 or fp32.
    autocast = torch.autocast(device.type, dtype=half, enabled=half is not None)
    steps = int(spec.max_steps or 1)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, steps)
    loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
        data.train,  # type: ignore[arg-type]
        batch_size=spec.micro_batch_size,
        shuffle=True,
        collate_fn=PadCollator(int(tokenizer.pad_token_id)),
        generator=torch.Generator().manual_seed(spec.seed),
        pin_memory=runtime.pin_memory,
    )
    batches = iter(loader)
    step_tokens: list[int] = []
    step_seconds: list[float] = []
    for _ in range(steps):
        start = time.perf_counter()
        tokens = 0
        for _ in range(spec.gradient_accumulation_steps):
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                batch = next(batches)
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast:
                loss = forward(**batch).loss / spec.gradient_accumulation_steps
            loss.backward()
            tokens += int(batch["input_ids"].numel())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()  # kernels run asynchronously: wait before reading the clock
        step_seconds.append(time.perf_counter() - start)
        step_tokens.append(tokens)
    return sum(step_tokens[WARMUP_STEPS:]) / sum(step_seconds[WARMUP_STEPS:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--size", default="s", help="tiny model size: xs | s (default s)")
    parser.add_argument(
        "--smoke", action="store_true", help="one repeat of 5 steps on xs: the suite runs it"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.steps, args.size, args.micro_batch_size = 1, 5, "xs", 2

    work = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    spec = run_spec(
        {
            "lora_r": 16,
            "lora_dropout": 0.0,
            "micro_batch_size": args.micro_batch_size,
            "gradient_accumulation_steps": args.accumulation,
            "max_length": 128,
        },
        Settings(work_dir=work, eval_interval=0, eval_samples=1),
        model=str(default_tiny_model(size=args.size)),
        data=str(demo_data_path("prompt_completion")),
        output_dir=work / "out",
        max_steps=args.steps,
    )
    # Packed blocks all have max_length tokens: both sides see batches of equal shape, so
    # the two data orders cannot make one side's batches cheaper per token.
    spec = dataclasses.replace(spec, overflow="pack")
    rows: list[list[object]] = []
    framework: list[float] = []
    bare: list[float] = []
    for repeat in range(args.repeats):
        # Alternate the order so drift on a shared machine hits both sides alike.
        if repeat % 2 == 0:
            f, b = framework_tokens_per_second(spec), bare_tokens_per_second(spec)
        else:
            b, f = bare_tokens_per_second(spec), framework_tokens_per_second(spec)
        framework.append(f)
        bare.append(b)
        rows.append([repeat + 1, f, b, f / b])
    ratios = [f / b for f, b in zip(framework, bare, strict=True)]
    rows.append(["median", median(framework), median(bare), median(ratios)])
    print(table(["repeat", "trainers.train tok/s", "bare loop tok/s", "ratio"], rows))
    ratio = median(ratios)
    print(f"ratio (framework / bare, median of per-repeat ratios): {ratio:.3f}  target >= 0.90")
    write_results(args.json, {
        "ratio": ratio, "ratios": ratios, "framework_tokens_per_second": framework,
        "bare_tokens_per_second": bare, "steps": args.steps, "warmup_steps_discarded": WARMUP_STEPS,
        "model_size": args.size, "micro_batch_size": args.micro_batch_size,
        "gradient_accumulation_steps": args.accumulation,
    })  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
