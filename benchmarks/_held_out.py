"""The held-out protocol the time-model benchmarks share.

A probe calibration (`analysis.calibrate`'s design), held-out configurations that share no
level with the probes, the synthetic data they train on, and the sizing of a held-out run
to a target duration. `time_model_accuracy.py`, `time_model_shape.py` and `gpu_check.py`
build on it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from analysis.calibrate import (
    PROBE_BUDGET_SECONDS,
    PROBE_DESIGN,
    ProbeConfig,
    calibrate_from_results,
    run_probes,
)
from analysis.calibration.file import Calibration
from analysis.planning.fits import plan_of_spec, probe_spec
from analysis.timemodel.model import Estimate, Plan, predict
from benchmarks._common import median
from trainers.spec import TrainSpec

EVAL_SAMPLES = 16
HOLDOUT_FACTOR = 12.0  # held-out runs are sized to ~12x the longest probe (>= 10x measured)


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One held-out configuration (no level is shared with the probe design)."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    lora_r: int

    @property
    def name(self) -> str:
        return (
            f"mb{self.micro_batch_size} ga{self.gradient_accumulation_steps} "
            f"len{self.max_length} r{self.lora_r}"
        )


# The probes use micro-batch 1/2/4/8, accumulation 1/2, max_length 64/128/256/512 and rank
# 4/32/64; the held-out runs share none of these levels. Their padded tokens per micro-batch
# stay within the probes' range (up to ~2,000), so the test is interpolation across
# configurations, not extrapolation beyond them.
HELD_OUT = (
    HeldOut(3, 4, 96, 8),
    HeldOut(6, 3, 192, 16),
    HeldOut(12, 3, 96, 48),
    HeldOut(3, 3, 384, 16),
    HeldOut(6, 4, 320, 8),
    HeldOut(12, 4, 160, 16),
    HeldOut(3, 4, 320, 48),
    HeldOut(6, 3, 96, 48),
    HeldOut(3, 3, 192, 8),
)


def synthetic_data(
    out: Path, *, samples: int = 1200, seed: int = 0, max_records: int = 40
) -> Path:
    """Texts of 1 to `max_records` demo records each: token lengths spread from ~10 to
    ~400 (at 40), about 10 tokens per record."""
    from trainers.data.paths import demo_data_path

    with demo_data_path("text").open(encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for line in lines]
    rng = random.Random(seed)
    with out.open("w", encoding="utf-8") as handle:
        for _ in range(samples):
            start = rng.randrange(len(texts))
            count = rng.randint(1, max_records)
            text = " ".join(texts[(start + i) % len(texts)] for i in range(count))
            handle.write(json.dumps({"text": text}) + "\n")
    return out


def held_out_spec(
    model: str,
    data: str,
    config: HeldOut,
    work: Path,
    name: str,
    *,
    steps: int,
    evaluations: bool = True,
) -> TrainSpec:
    """A held-out run of `steps` optimizer steps: about three evaluations and two saves."""
    return probe_spec(
        config,
        model=model,
        data=data,
        work_dir=work,
        name=name,
        max_steps=steps,
        eval_interval=max(1, steps // 3) if evaluations else 0,
        checkpoint_interval=max(1, steps // 2) if evaluations else 0,
        eval_samples=EVAL_SAMPLES,
    )


def lengths_of(spec: TrainSpec) -> tuple[tuple[int, ...], int]:
    """Train token lengths at the spec's max_length and the validation count (as it trains)."""
    from trainers.data.dataset import load_tokenized
    from trainers.model.lora import load_tokenizer

    loaded = load_tokenized(spec.data_spec(), load_tokenizer(spec.model))
    return tuple(len(e.input_ids) for e in loaded.train), len(loaded.validation)


def size_run(
    calibration: Calibration,
    spec_of: Callable[[int], TrainSpec],
    lengths: tuple[int, ...],
    n_validation: int,
    target_seconds: float,
) -> tuple[TrainSpec, Plan, Estimate]:
    """The fewest optimizer steps whose predicted median reaches `target_seconds`.

    Args:
        calibration: The fitted time model.
        spec_of: The run of a given number of optimizer steps.
        lengths: Its train token lengths.
        n_validation: Its validation samples.
        target_seconds: The duration to reach.
    """

    def plan(steps: int) -> Plan:
        return plan_of_spec(
            spec_of(steps),
            calibration.model,
            lengths,
            n_validation=n_validation,
            hardware=calibration.hardware,
        )

    def seconds(steps: int) -> float:
        return predict(plan(steps), calibration.coefficients).seconds_p50

    low, high = 1, 2
    while seconds(high) < target_seconds:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if seconds(middle) < target_seconds else (low, middle)
    return spec_of(high), plan(high), predict(plan(high), calibration.coefficients)


def run_held_out(spec: TrainSpec) -> dict[str, Any]:
    """Train `spec`; return the trainer's result dict."""
    from trainers.loop.run import train

    return train(spec).to_dict()


def calibrate(
    model: str,
    data: str,
    work: Path,
    design: Sequence[ProbeConfig] = PROBE_DESIGN,
    budget_seconds: float = PROBE_BUDGET_SECONDS,
) -> dict[str, Any]:
    """Run the probe design (no new run after most of `budget_seconds`) and fit."""
    from analysis.timemodel.machine import this_machine

    started = time.perf_counter()
    probes = run_probes(
        model, data, design, work_dir=work / "probes", budget_seconds=budget_seconds
    )
    seconds = time.perf_counter() - started
    walls = [float(p["wall_seconds"]) for p in probes]
    hardware = this_machine()
    return {
        "calibration": calibrate_from_results(probes, hardware),
        "hardware": hardware,
        "results": probes,  # the trainer's result dicts (`time_model_refit.py` reads them)
        "runs": len(probes),
        "seconds": seconds,
        "median_seconds": median(walls),
        "longest_seconds": max(walls),
    }
