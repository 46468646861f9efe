"""`python -m trainers.train`: one LoRA training run from flags or a preset file."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from trainers.cli import EXIT_OK, check_writable, run_cli, write_json
from trainers.errors import BadInputError
from trainers.spec import TrainSpec

# Flag name -> TrainSpec field, for the flags that map one to one.
_FIELD_FLAGS: dict[str, tuple[type, str]] = {
    "output_dir": (str, "checkpoints and logs"),
    "micro_batch_size": (int, "samples per forward/backward"),
    "gradient_accumulation_steps": (int, "micro-batches per optimizer step"),
    "learning_rate": (float, "peak learning rate"),
    "weight_decay": (float, "AdamW weight decay"),
    "scheduler": (str, "linear | cosine | constant | constant_with_warmup"),
    "warmup_ratio": (float, "share of steps spent warming up"),
    "max_steps": (int, "optimizer steps (overrides --epochs)"),
    "epochs": (float, "passes over the training set"),
    "max_length": (int, "tokens per sample (longer ones are truncated or packed)"),
    "overflow": (str, "truncate | pack"),
    "validation_fraction": (float, "share of samples held out for validation"),
    "eval_interval": (int, "optimizer steps between evaluations (0: at the end only)"),
    "eval_samples": (int, "validation samples per evaluation"),
    "checkpoint_interval": (int, "optimizer steps between checkpoints (0: none)"),
    "precision": (str, "auto | fp32 | bf16 | fp16"),
    "device": (str, "auto | cpu | cuda | mps"),
    "seed": (int, "random seed"),
    "cache_dir": (str, "tokenized-data cache folder"),
}
_LORA_FLAGS: dict[str, tuple[type, str]] = {
    "r": (int, "LoRA rank"),
    "alpha": (float, "LoRA alpha"),
    "dropout": (float, "LoRA dropout"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainers.train",
        description="Train LoRA adapters on a local causal LM, from flags or a preset file.",
    )
    parser.add_argument("--preset", help="preset YAML exported by a study (python -m hpo.export)")
    parser.add_argument("--model", help="local model folder (transformers format)")
    parser.add_argument("--data", help="JSONL file: text, prompt/completion or messages")
    for name, (kind, help_text) in _FIELD_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help=help_text)
    for name, (kind, help_text) in _LORA_FLAGS.items():
        parser.add_argument(f"--lora-{name}", type=kind, help=help_text)
    parser.add_argument(
        "--lora-targets", help="comma-separated module names, or 'auto' (every linear projection)"
    )
    parser.add_argument("--gradient-checkpointing", action="store_true", default=None)
    parser.add_argument("--compile", action="store_true", default=None, help="torch.compile")
    parser.add_argument("--skip-bad-lines", action="store_true", default=None)
    parser.add_argument("--json", help="write the run's measurements to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def spec_from_args(args: argparse.Namespace) -> tuple[TrainSpec, dict[str, Any]]:
    """Merge flags over the preset (when given). Returns the spec and the preset's estimate."""
    from dataclasses import asdict

    from trainers.preset import load_preset

    values: dict[str, Any] = {
        name: getattr(args, name)
        for name in (*_FIELD_FLAGS, "gradient_checkpointing", "compile", "skip_bad_lines")
    }
    values.update(model=args.model, data=args.data)
    lora: dict[str, Any] = {n: getattr(args, f"lora_{n}") for n in _LORA_FLAGS}
    if args.lora_targets:
        targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
        lora["target_modules"] = "auto" if targets == ["auto"] else targets
    lora = {k: v for k, v in lora.items() if v is not None}

    if args.preset:
        preset = load_preset(args.preset, **values)
        if lora:
            merged = {**asdict(preset.spec.lora), **lora}
            spec = TrainSpec.from_dict({**preset.spec.to_dict(), "lora": merged})
        else:
            spec = preset.spec
        return spec, preset.estimate
    if not args.model or not args.data:
        raise BadInputError("give --preset FILE, or both --model and --data")
    given = {k: v for k, v in values.items() if v is not None}
    if lora:
        given["lora"] = lora
    return TrainSpec.from_dict(given), {}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec, _estimate = spec_from_args(args)
    if args.json:
        check_writable(args.json)

    from trainers.progress import TqdmProgress
    from trainers.run import train

    callbacks = [] if args.quiet else [TqdmProgress(file=sys.stderr)]
    result = train(spec, callbacks)
    summary = (
        f"{result.optimizer_steps} steps in {result.wall_seconds:.1f} s "
        f"({result.tokens_per_second:,.0f} tokens/s on {result.device}/{result.precision}); "
        f"final train loss {result.final_train_loss:.4f}"
    )
    if result.eval_losses:
        first, last = result.eval_losses[0][1], result.eval_losses[-1][1]
        summary += f"; validation loss {first:.4f} -> {last:.4f}"
    print(summary)
    if args.json:
        write_json(args.json, result.to_dict())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_cli(main))
