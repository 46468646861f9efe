"""Does scaling the learning rate with the effective batch help a search on the tiny model?

A search space samples the learning rate from one range whatever batch the profile gives.
With ``learning_rate_scaling`` the sampled rate is a base rate at a reference effective
batch (16) and the configuration trains with it scaled to its own batch: by the square root
(sqrt) or linearly (linear) of the batch ratio, or not at all (none).

Protocol, per seed: draw `--draws` configurations (a base learning rate from the default
space's range, log-uniform, and an effective batch of 4, 8, 16 or 32), identical for every
scaling mode, so the comparison is paired. Every configuration trains on the same budget
(one epoch of the same `--samples` training samples, micro-batch 4, the accumulation making
up the batch, linear decay) and is scored by its final validation loss on the same samples.
Reported per mode: the mean, the best and the worst final loss over the draws, each as a
median over seeds, and the paired difference against `none` (negative: scaling helped),
with the seed-to-seed spread as the noise floor. Losses are deterministic on one machine;
only the times vary, so a loaded machine changes the duration, not the result.

    python benchmarks/lr_scaling.py [--seeds 3] [--draws 4] [--samples 240] [--json FILE] [--smoke]
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine, table, write_json  # noqa: E402
from search_spaces import LogUniform, load_space  # noqa: E402
from search_spaces.space import LR_SCALINGS  # noqa: E402
from trainers.data.paths import demo_data_path  # noqa: E402
from trainers.loop.run import train  # noqa: E402
from trainers.run_spec import Settings, run_spec  # noqa: E402
from trainers.tiny import default_tiny_model  # noqa: E402

EFFECTIVE_BATCHES = (4, 8, 16, 32)
MICRO_BATCH = 4


def draws(seed: int, n: int) -> list[tuple[float, int]]:
    """`n` (base learning rate, effective batch) pairs from the default space's range."""
    space = load_space()
    domain = space.domains["learning_rate"]
    assert isinstance(domain, LogUniform)
    rng = random.Random(seed)
    return [
        (
            math.exp(rng.uniform(math.log(domain.low), math.log(domain.high))),
            rng.choice(EFFECTIVE_BATCHES),
        )
        for _ in range(n)
    ]


def final_loss(
    model: str, data: str, work: Path, *, lr: float, batch: int, seed: int, samples: int
) -> float:
    spec = run_spec(
        {
            "lora_r": 8,
            "micro_batch_size": MICRO_BATCH,
            "gradient_accumulation_steps": batch // MICRO_BATCH,
            "learning_rate": min(lr, 0.5),
            "max_length": 64,
        },
        Settings(
            work_dir=work,
            eval_interval=0,
            eval_samples=64,
            validation_fraction=64 / (samples + 64),
            seed=seed,
        ),
        model=model,
        data=data,
        output_dir=work / f"run-{time.monotonic_ns()}",
    )
    result = train(spec)
    assert result.final_eval_loss is not None
    return float(result.final_eval_loss)


def subset(path: Path, n: int, out: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()[:n]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--samples", type=int, default=240, help="Training samples.")
    parser.add_argument(
        "--pretrain-steps", type=int, default=0, help="Use the tiny model pre-trained this long."
    )
    parser.add_argument("--json")
    parser.add_argument(
        "--smoke", action="store_true", help="one seed, one draw, 32 samples: the suite runs it"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.draws, args.samples = 1, 1, 32
    logging.basicConfig(level=logging.WARNING)
    model = str(default_tiny_model(pretrain_steps=args.pretrain_steps))
    space = load_space()
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lr-scaling-") as folder:
        work = Path(folder)
        data = subset(demo_data_path("prompt_completion"), args.samples + 64, work / "data.jsonl")
        for seed in range(args.seeds):
            for base, batch in draws(seed, args.draws):
                by_lr: dict[float, float] = {}  # at the reference batch every mode is the same
                for mode in LR_SCALINGS:
                    factor = _factor(space, mode, batch)
                    if base * factor not in by_lr:
                        by_lr[base * factor] = final_loss(
                            model, data, work, lr=base * factor, batch=batch, seed=seed,
                            samples=args.samples,
                        )  # fmt: skip
                    loss = by_lr[base * factor]
                    runs.append(
                        {"seed": seed, "mode": mode, "batch": batch, "base_lr": base,
                         "lr": base * factor, "final_val_loss": loss}
                    )  # fmt: skip
                    print(f"seed {seed} batch {batch:2d} base {base:.2e} {mode:6s} {loss:.4f}")
    summary = summarise(runs, args.seeds)
    print(
        table(
            ["scaling", "mean loss", "best", "worst", "mean - none", "spread over seeds"],
            [
                [m, s["mean"], s["best"], s["worst"], s["mean_minus_none"], s["spread"]]
                for m, s in summary.items()
            ],
        )
    )
    write_json(
        args.json,
        {
            "machine": machine(),
            "seeds": args.seeds,
            "draws": args.draws,
            "samples": args.samples,
            "pretrain_steps": args.pretrain_steps,
            "seconds": time.perf_counter() - started,
            "summary": summary,
            "runs": runs,
        },
    )
    return 0


def _factor(space: Any, mode: str, batch: int) -> float:
    import dataclasses

    return float(dataclasses.replace(space, learning_rate_scaling=mode).learning_rate_factor(batch))


def summarise(runs: list[dict[str, Any]], seeds: int) -> dict[str, dict[str, float]]:
    """Per mode: medians over seeds of the mean/best/worst loss over draws, paired vs none."""
    out: dict[str, dict[str, float]] = {}
    for mode in LR_SCALINGS:
        per_seed = []
        for seed in range(seeds):
            mine = [r["final_val_loss"] for r in runs if r["seed"] == seed and r["mode"] == mode]
            none = [r["final_val_loss"] for r in runs if r["seed"] == seed and r["mode"] == "none"]
            per_seed.append(
                (
                    statistics.mean(mine),
                    min(mine),
                    max(mine),
                    statistics.mean(mine) - statistics.mean(none),
                )
            )
        means = [p[0] for p in per_seed]
        out[mode] = {
            "mean": statistics.median(means),
            "best": statistics.median(p[1] for p in per_seed),
            "worst": statistics.median(p[2] for p in per_seed),
            "mean_minus_none": statistics.median(p[3] for p in per_seed),
            "spread": max(means) - min(means),
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
