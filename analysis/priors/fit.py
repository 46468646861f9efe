"""Priors fitted to published LoRA runs: per-GPU utilisation, memory terms, and their band.

`replay` predicts one published run through the plan's own code (`analysis.planning.fits.evaluate`
with a `RunSetup`), `fit` fits the priors to the rows not held out, robustly (medians and
least absolute log errors); `python -m benchmarks.published_runs --write-priors` stores them
in `published_priors.json`, which `analysis.priors.fitted` reads for `analysis.plan`.

Time: seconds per optimizer step = rest + accumulation x fixed + FLOP time / utilisation;
one utilisation per GPU kind (the median over its points; kinds without points take the
median of all), one fixed seconds per micro-step for all. The band is the spread (min to
max) of the leave-one-out errors of the fitted points: a point's error is measured with
priors fitted without it, so the band is what a new setup sees, not what the fit memorised.
Memory: `analysis.timemodel.run_setup.MemoryTerms`, its p90 the largest under-prediction.
A row whose speed was not published (NaN) is fitted for memory alone.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.priors.fitted import GIB, PublishedPriors, with_utilisation
from analysis.priors.published_runs import PublishedRun
from analysis.timemodel.gpus import find_gpu, peak_of
from analysis.timemodel.hardware import prior_coefficients
from analysis.timemodel.model import ModelProfile, predict
from analysis.timemodel.run_setup import MemoryTerms, RunSetup, memory_parts, peak_memory

REPLAY_STEPS = 20  # optimizer steps a replay plans (the per-step time does not depend on it)
MEMORY_MARGIN = 0.01  # log: 1 %, so that rounding never puts a fitted peak above p90
_FIXED_GRID = tuple(i * 0.005 for i in range(61))  # 0 .. 0.3 s per micro-step


# ----------------------------------------------------------------------------- replay


def setup_of(run: PublishedRun) -> RunSetup:
    """The plan fields a published run's setup sets: those of `RunSetup` it records."""
    names = [f.name for f in dataclasses.fields(RunSetup) if hasattr(run, f.name)]
    return RunSetup(**{name: getattr(run, name) for name in names})


@dataclass(frozen=True)
class Replay:
    """A published run as the plan predicts it (seconds per optimizer step, GiB)."""

    seconds_p10: float
    seconds_p50: float
    seconds_p90: float
    memory_p50_gib: float
    memory_p90_gib: float
    memory_parts_gib: dict[str, float]
    flop_seconds_at_full_peak: float  # FLOP part of one step at utilisation 1
    rest_seconds: float  # what does not scale with utilisation (loop, optimizer)


def replay(
    run: PublishedRun,
    model: ModelProfile,
    *,
    utilisation: float,
    micro_fixed_seconds: float,
    log_p10: float,
    log_p90: float,
    memory: MemoryTerms,
) -> Replay:
    """Predict `run` with the plan's code: `analysis.planning.fits` shapes, `predict`, memory terms.

    Args:
        run: The published row.
        model: The profile of its config with its LoRA targets (`profile_for`).
        utilisation: Fraction of the GPU's peak.
        micro_fixed_seconds: Overhead per micro-step.
        log_p10: Band's lower end.
        log_p90: Band's upper end.
        memory: Memory terms.
    """
    from analysis.planning.fits import RunShape, plan_of_shape
    from analysis.planning.inputs import lengths_from_count

    gpu = find_gpu(run.gpu)
    setup = setup_of(run)
    shape = RunShape(
        micro_batch_size=run.micro_batch_size,
        gradient_accumulation_steps=run.gradient_accumulation_steps,
        max_length=run.max_length,
        lora_r=run.lora_r,
        gradient_checkpointing=run.gradient_checkpointing,
        gpus=run.gpus,
    )
    samples = REPLAY_STEPS * run.micro_batch_size * run.gradient_accumulation_steps * run.gpus
    lengths = lengths_from_count(samples * 2, max(1, round(run.tokens_per_sample)))
    plan = dataclasses.replace(
        plan_of_shape(shape, model, lengths, gpu),
        max_steps=REPLAY_STEPS, eval_interval_steps=0, checkpoint_interval_steps=0,
        quantization=setup.quantization,
        packing="padding_free" if run.padding_free else "none",
    )  # fmt: skip
    peak = peak_of(gpu)
    base = prior_coefficients(gpu.hardware(), peak=peak)

    def per_step(u: float, fixed: float) -> float:
        c = with_utilisation(
            base, peak, u, fixed, log_p10=log_p10, log_p90=log_p90, source="replay"
        )
        return predict(plan, c).breakdown["train"] / REPLAY_STEPS

    one, two = per_step(1.0, 0.0), per_step(2.0, 0.0)
    flop = 2.0 * (one - two)
    rest = one - flop
    c = with_utilisation(
        base, peak, utilisation, micro_fixed_seconds, log_p10=log_p10, log_p90=log_p90,
        source="replay",
    )  # fmt: skip
    estimate = predict(plan, c)
    p50 = estimate.breakdown["train"] / REPLAY_STEPS
    low, high = (
        estimate.seconds_p10 / estimate.seconds_p50,
        estimate.seconds_p90 / estimate.seconds_p50,
    )
    mem50, mem90 = peak_memory(plan, setup, memory)
    parts = {k: v / GIB for k, v in memory_parts(plan, setup, memory).items()}
    return Replay(p50 * low, p50, p50 * high, mem50 / GIB, mem90 / GIB, parts, flop, rest)


def profile_for(run: PublishedRun, cache: dict[tuple[str, Any], ModelProfile]) -> ModelProfile:
    """The meta-device profile of the run's shipped config with its LoRA targets (cached)."""
    from analysis.planning.inputs import load_model_config, shipped_configs
    from analysis.timemodel.machine import config_profile

    setup = setup_of(run)
    key = (run.model, setup.peft_targets)
    if key not in cache:
        config = load_model_config(shipped_configs()[run.model])
        cache[key] = config_profile(config, source=run.model, target_modules=setup.peft_targets)
    return cache[key]


# ----------------------------------------------------------------------------- fit


def _needed_utilisation(run: PublishedRun, r: Replay, fixed: float) -> float:
    """The utilisation at which the plan's step time equals the published one."""
    left = run.seconds_per_step - r.rest_seconds - run.gradient_accumulation_steps * fixed
    return min(r.flop_seconds_at_full_peak / left, 1.0) if left > 0 else 1.0


def _geo_median(values: Iterable[float]) -> float:
    return math.exp(statistics.median(math.log(v) for v in values))


def _predicted(run: PublishedRun, r: Replay, u: float, fixed: float) -> float:
    return (
        r.rest_seconds + run.gradient_accumulation_steps * fixed + r.flop_seconds_at_full_peak / u
    )


def _time_fit(
    runs: Sequence[PublishedRun], replays: Sequence[Replay], fixed: float
) -> tuple[dict[str, float], float, list[float]]:
    """Per-GPU utilisation, pooled one, and each point's leave-one-out log error."""
    needed = [_needed_utilisation(run, r, fixed) for run, r in zip(runs, replays, strict=True)]

    def fit_without(skip: int | None) -> tuple[dict[str, float], float]:
        by_gpu: dict[str, list[float]] = {}
        for i, (run, u) in enumerate(zip(runs, needed, strict=True)):
            if i != skip:
                by_gpu.setdefault(run.gpu, []).append(u)
        per_gpu = {gpu: _geo_median(us) for gpu, us in by_gpu.items()}
        pooled = _geo_median(u for i, u in enumerate(needed) if i != skip)
        return per_gpu, pooled

    loo = []
    for i, (run, r) in enumerate(zip(runs, replays, strict=True)):
        per_gpu, pooled = fit_without(i)
        u = per_gpu.get(run.gpu, pooled)
        loo.append(math.log(run.seconds_per_step / _predicted(run, r, u, fixed)))
    per_gpu, pooled = fit_without(None)
    return per_gpu, pooled, loo


def _memory_fit(
    runs: Sequence[PublishedRun],
    plans: Sequence[Any],
    start: MemoryTerms,
) -> MemoryTerms:
    """Memory terms by least absolute log error over the fitted runs (Nelder-Mead, bounded).

    Their p90 is the largest under-prediction of any fitted run, each predicted by the terms
    fitted without its model and GPU (leave one group out: a plan is made for a model and a
    GPU the table may not have), so that the bound holds runs the fit did not see.
    """
    terms = _memory_minimise(runs, plans, start)
    worst = 0.0
    for group in sorted({_group(run) for run in runs}):
        inside = [i for i, run in enumerate(runs) if _group(run) == group]
        others = [r for j, r in enumerate(runs) if j not in inside]
        if not others:
            continue
        other_plans = [p for j, p in enumerate(plans) if j not in inside]
        without = _memory_minimise(others, other_plans, terms)
        for i in inside:
            predicted = peak_memory(plans[i], setup_of(runs[i]), without)[0]
            worst = max(worst, math.log(runs[i].memory_gib * GIB / predicted))
    for run, plan in zip(runs, plans, strict=True):
        predicted = peak_memory(plan, setup_of(run), terms)[0]
        worst = max(worst, math.log(run.memory_gib * GIB / predicted))
    return dataclasses.replace(terms, log_p90=worst + MEMORY_MARGIN)


def _group(run: PublishedRun) -> tuple[str, str]:
    """Runs of one model on one GPU: what a new user's model and GPU would not share."""
    return (run.model, run.gpu)


def _memory_minimise(
    runs: Sequence[PublishedRun], plans: Sequence[Any], start: MemoryTerms
) -> MemoryTerms:
    from scipy.optimize import minimize

    bounds = ((0.3, 4.0), (4.0, 16.0), (0.0, 4.0), (1.0, 1.5), (0.0, 3.0))

    def terms_of(x: Sequence[float]) -> MemoryTerms:
        a, b, f, r, v = (min(max(v, lo), hi) for v, (lo, hi) in zip(x, bounds, strict=True))
        return dataclasses.replace(
            start, activation_scale=a, logits_fp32_bytes=b, fixed_bytes=f * GIB,
            reserved_over_allocated=r, varied_length_reserve=v,
        )  # fmt: skip

    def loss(x: Sequence[float]) -> float:
        terms = terms_of(x)
        return sum(
            abs(math.log(peak_memory(plan, setup_of(run), terms)[0] / GIB / run.memory_gib))
            for run, plan in zip(runs, plans, strict=True)
        )

    x0 = [
        start.activation_scale,
        start.logits_fp32_bytes,
        start.fixed_bytes / GIB,
        start.reserved_over_allocated,
        # From zero Nelder-Mead's first step is too small to leave it.
        start.varied_length_reserve or (0.5 if any(run.lengths_vary for run in runs) else 0.0),
    ]
    best = minimize(
        loss, x0, method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-4, "maxiter": 2000}
    )
    return terms_of(best.x)


def fit(
    runs: Sequence[PublishedRun], cache: dict[tuple[str, Any], ModelProfile]
) -> PublishedPriors:
    """Fit the priors to `runs` (pass the rows not held out)."""
    neutral = MemoryTerms()
    replays = [
        replay(run, profile_for(run, cache), utilisation=1.0, micro_fixed_seconds=0.0,
               log_p10=0.0, log_p90=0.0, memory=neutral)
        for run in runs
    ]  # fmt: skip
    kept = [i for i, run in enumerate(runs) if math.isfinite(run.seconds_per_step)]
    timed, timed_replays = [runs[i] for i in kept], [replays[i] for i in kept]
    best: tuple[float, float] | None = None
    for fixed in _FIXED_GRID:
        _, _, loo = _time_fit(timed, timed_replays, fixed)
        score = statistics.median(abs(e) for e in loo)
        if best is None or score < best[0]:
            best = (score, fixed)
    assert best is not None
    fixed = best[1]
    per_gpu, pooled, loo = _time_fit(timed, timed_replays, fixed)
    plans = [_memory_plan(run, profile_for(run, cache)) for run in runs]
    memory = _memory_fit(runs, plans, neutral)
    return PublishedPriors(
        utilisation=per_gpu,
        pooled_utilisation=pooled,
        micro_fixed_seconds=fixed,
        log_p10=min(min(loo), 0.0),
        log_p90=max(max(loo), 0.0),
        memory=memory,
        fitted_points=tuple(run.name for run in runs),
        timed_points=tuple(run.name for run in timed),
    )


def _memory_plan(run: PublishedRun, model: ModelProfile) -> Any:
    from analysis.planning.fits import RunShape, plan_of_shape
    from analysis.planning.inputs import lengths_from_count

    shape = RunShape(
        run.micro_batch_size, run.gradient_accumulation_steps, run.max_length, run.lora_r,
        run.gradient_checkpointing,
    )  # fmt: skip
    lengths = lengths_from_count(8, max(1, round(run.tokens_per_sample)))
    return plan_of_shape(shape, model, lengths, find_gpu(run.gpu))


def replay_with(
    run: PublishedRun, priors: PublishedPriors, cache: dict[tuple[str, Any], ModelProfile]
) -> Replay:
    """Replay `run` with fitted priors (its GPU's utilisation, else the pooled one)."""
    return replay(
        run, profile_for(run, cache),
        utilisation=priors.utilisation_for(find_gpu(run.gpu)),
        micro_fixed_seconds=priors.micro_fixed_seconds,
        log_p10=priors.log_p10, log_p90=priors.log_p90, memory=priors.memory,
    )  # fmt: skip
