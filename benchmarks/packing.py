"""Padded against padding-free packed training, side by side: one epoch of each.

The same tiny model, data, learning rate and seed; one epoch each, alternating which goes
first so drift on a shared machine hits both alike. At equal memory: the packed run's
sequences hold as many token slots as the padded run's micro-batches do on average
(``--padded-batch`` samples, each batch padded to its longest; dynamic padding), rounded up
to a multiple of 16, one packed sequence per micro-batch. Reported per data set and mode:
padding share of the micro-batches (slots that are padding), optimizer steps per epoch,
real (non-padding) tokens per second of training, training wall time per epoch, the
validation loss after the epoch (the same validation samples, never packed), and the
micro-step time per 1,000 slots, which says whether this machine's steps cost by tokens
(packing pays in proportion to the padding it removes) or by something else.

    python benchmarks/packing.py [--json FILE] [--repeats 2] [--samples 800]
        [--shapes chat prompt_completion] [--padded-batch 8] [--size xs] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, table, write_results  # noqa: E402
from trainers.data.dataset import load_tokenized  # noqa: E402
from trainers.data.packing import padding_share  # noqa: E402
from trainers.data.paths import demo_data_path  # noqa: E402
from trainers.loop.run import train  # noqa: E402
from trainers.model.lora import load_tokenizer  # noqa: E402
from trainers.run_spec import Settings, run_spec  # noqa: E402
from trainers.spec import TrainSpec  # noqa: E402
from trainers.tiny import default_tiny_model  # noqa: E402

MAX_LENGTH = 512  # no bundled sample is longer: nothing is truncated on either side


def one_epoch(spec: TrainSpec, real_tokens: int) -> dict[str, Any]:
    """Train one epoch and measure it."""
    result = train(spec)
    slots = sum(result.micro_step_tokens)
    seconds = sum(result.step_seconds)
    micro = sorted(
        s / t * 1000
        for s, t in zip(result.micro_step_seconds, result.micro_step_tokens, strict=True)
    )
    return {
        "padding_share": 1.0 - real_tokens / slots if slots else 0.0,
        "steps": result.optimizer_steps,
        "slots_per_micro_batch": slots / max(1, len(result.micro_step_tokens)),
        "real_tokens": result.tokens_seen if spec.packing != "none" else real_tokens,
        "real_tokens_per_second": real_tokens / seconds,
        "epoch_seconds": seconds,
        "val_loss": result.final_eval_loss,
        "micro_seconds_per_1k_slots": micro[len(micro) // 2],
    }


def subset(shape: str, samples: int, work: Path) -> Path:
    """The first `samples` records of a bundled data set (a shorter epoch)."""
    lines = demo_data_path(shape).read_text(encoding="utf-8").splitlines(True)
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{shape}-{samples}.jsonl"
    path.write_text("".join(lines[:samples]), encoding="utf-8")
    return path


def compare(args: argparse.Namespace, shape: str, model: Path, work: Path) -> dict[str, Any]:
    data = subset(shape, args.samples, work)
    base = run_spec(
        {
            "lora_r": 8,
            "lora_dropout": 0.0,
            "micro_batch_size": args.padded_batch,
            "learning_rate": args.learning_rate,
            "max_length": MAX_LENGTH,
        },
        Settings(work_dir=work, epochs=1.0, eval_interval=0, eval_samples=args.eval_samples),
        model=str(model),
        data=str(data),
        output_dir=work / "out",
    )
    tokenized = load_tokenized(base.data_spec(), load_tokenizer(str(model)))
    lengths = [len(e.input_ids) for e in tokenized.train]
    real = sum(lengths)
    expected_slots = real / (1 - padding_share(lengths, args.padded_batch))
    per_batch = expected_slots / math.ceil(len(lengths) / args.padded_batch)
    capacity = max(max(lengths), 16 * math.ceil(per_batch / 16))
    packed_spec = dataclasses.replace(
        base, micro_batch_size=1, max_length=capacity, packing="padding_free"
    )
    runs: dict[str, list[dict[str, Any]]] = {"padded": [], "packed": []}
    for repeat in range(args.repeats):
        order = ["padded", "packed"] if repeat % 2 == 0 else ["packed", "padded"]
        for mode in order:
            spec = base if mode == "padded" else packed_spec
            runs[mode].append(one_epoch(spec, real))
    ratios = [
        p["epoch_seconds"] / d["epoch_seconds"]
        for p, d in zip(runs["packed"], runs["padded"], strict=True)
    ]
    return {
        "shape": shape,
        "train_samples": len(lengths),
        "real_tokens": real,
        "tokens_mean": real / len(lengths),
        "packed_capacity": capacity,
        "runs": runs,
        "packed_over_padded_epoch_seconds": ratios,
        "median_ratio": median(ratios),
    }


def summary_rows(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for mode in ("padded", "packed"):
        runs = result["runs"][mode]
        spread = [r["epoch_seconds"] for r in runs]
        rows.append(
            [
                result["shape"],
                mode,
                runs[0]["padding_share"],
                runs[0]["steps"],
                median([r["slots_per_micro_batch"] for r in runs]),
                median([r["real_tokens_per_second"] for r in runs]),
                median(spread),
                (max(spread) - min(spread)) / median(spread),
                median([r["val_loss"] for r in runs]),
                median([r["micro_seconds_per_1k_slots"] for r in runs]),
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--samples", type=int, default=800, help="records of each data set")
    parser.add_argument("--shapes", nargs="+", default=["chat", "prompt_completion"])
    parser.add_argument("--padded-batch", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--eval-samples", type=int, default=64)
    parser.add_argument("--size", default="xs")
    parser.add_argument(
        "--smoke", action="store_true", help="one repeat of 48 chat records: the suite runs it"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.samples, args.shapes, args.eval_samples = 1, 48, ["chat"], 8
    model = default_tiny_model(size=args.size)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            results.append(compare(args, shape, model, Path(tmp) / shape))
    headers = [
        "data",
        "mode",
        "padding",
        "steps/epoch",
        "slots/micro",
        "real tok/s",
        "epoch s",
        "spread",
        "val loss",
        "micro s/1k slots",
    ]
    print(table(headers, [row for r in results for row in summary_rows(r)]))
    for r in results:
        print(
            f"{r['shape']}: packed/padded epoch time, median of {args.repeats}: "
            f"{r['median_ratio']:.2f} (packed sequences of {r['packed_capacity']} tokens)"
        )
    settings = {"padded_batch": args.padded_batch, "samples": args.samples, "model_size": args.size}
    write_results(args.json, {"results": results, **settings})
    return 0


if __name__ == "__main__":
    sys.exit(main())
