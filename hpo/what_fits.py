"""When nothing in the space fits the budget: stop before the study starts, saying what would.

`check_space` runs between `prepare` and the creation of the Optuna study, so a budget that
nothing fits ends the command (exit 2) before anything is written. It tries, in order: a
faster profile of the space, fewer epochs (the most that fit, by bisection), a shorter
max_length; the same run on more GPUs (2, 4 or 8, data-parallel) is offered beside them.

During a study: the few configurations that fit a tight window to start with
(`feasible_starts`), the probe's share of a search budget (`probe_seconds`), and the sampler's
proposals judged and repaired as a trial's check would judge them (`Proposals`).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from common.errors import BadInputError
from common.fmt import format_duration
from search_spaces import Choice, IntRange, SearchSpace
from search_spaces.sampling import PROFILE_FIELDS, profile_param_name
from search_spaces.space import WORDS

if TYPE_CHECKING:
    from hpo.estimator import StudyEstimator
    from hpo.predictions import Verdict

log = logging.getLogger(__name__)

# Learning rate, alpha and dropout change neither a run's duration nor its memory; the
# candidates carry valid placeholders because the training they become needs them.
TIME_NEUTRAL_PARAMS: dict[str, Any] = {
    "learning_rate": 1e-3,
    "lora_alpha": 16.0,
    "lora_dropout": 0.0,
}


# GPU counts of one node a refused study suggests (the nodes the study plans for hold 1-8).
GPU_COUNTS = (2, 4, 8)
# A refusal on the priors alone would be a guess: when their optimistic end (p10) fits, the
# study measures this machine first (the probe design, saved for later studies).
PROBE_BEFORE_REFUSING_SECONDS = 60.0
# ... and that probe is search time: with `--search-hours` at most this share of it (its
# first three runs always run): a short search would spend a large share of its budget
# measuring before its first trial (docs/notes/tuned-constants.md).
PROBE_SHARE_OF_SEARCH = 0.05
# ... and the priors' p10 is not that optimistic where fixed costs dominate: the CPU priors
# can be a few times pessimistic (docs/notes/tuned-constants.md), which would refuse a window
# half the space fits unmeasured. A prior p10 up to this factor beyond the window is measured
# before refusing; a budget further off (a 7B model's month in a day) is refused at once.
PRIOR_MAX_PESSIMISM = 4.0


def check_space(estimator: StudyEstimator) -> None:
    """Raise when no configuration of the allowed profiles fits, saying what would.

    Without a calibration for this machine and model, a "nothing fits" from the priors whose
    p10 is within `PRIOR_MAX_PESSIMISM` of the window is checked by measuring first
    (`probe_seconds`).

    Raises:
        BadInputError: Nothing fits; the one-line message carries the suggestion.
    """
    space = estimator.prepared.space
    allowed = tuple(estimator.config.profiles or space.profile_names)
    fastest, params = _fastest(estimator, allowed)
    if fastest.feasible:
        return
    if _worth_measuring(estimator, fastest):
        seconds = probe_seconds(estimator)
        log.warning(
            "by the uncalibrated time model nothing fits (the fastest, %s, is %s), but the "
            "priors can be that far off: measuring this machine (about %.0f s) before deciding",
            _describe(params),
            fastest.reason,
            seconds,
        )
        estimator.probe(seconds)
        fastest, params = _fastest(estimator, allowed)
        if fastest.feasible:
            return
    head = (
        f"no configuration fits the budget: the fastest ({_describe(params)}) is {fastest.reason}"
    )
    others = tuple(name for name in space.profiles if name not in allowed)
    if others:
        verdict, params = _fastest(estimator, others)
        if verdict.feasible:
            raise BadInputError(
                f"{head}; a faster profile would fit: --profiles {params['profile']} "
                f"({_describe(params)}, p90 {format_duration(verdict.full_run.seconds_p90)})"
            )
    # The same run on more GPUs is offered beside the changes of the run itself.
    more = _more_gpus(estimator, allowed)
    gpus = "" if more is None else f" (or the same on {more[0]} GPUs: --gpus-per-run {more[0]})"
    epochs = _most_epochs(estimator, allowed)
    if epochs is not None:
        raise BadInputError(f"{head}; fewer epochs would fit: --epochs {epochs:g}{gpus}")
    shorter = _shorter_max_length(estimator, allowed)
    if shorter is not None:
        length, profile = shorter
        how = (
            f"--max-length {length}, which cuts the longer samples"
            if space.profiles[profile].length_from_study
            else "set max_length in the space's profiles"
        )
        raise BadInputError(
            f"{head}; a shorter max_length would fit: {length} tokens with profile "
            f"'{profile}' ({how}){gpus}"
        )
    if more is not None:
        raise BadInputError(
            f"{head}; more GPUs per full run would fit: --gpus-per-run {more[0]} (p90 "
            f"{format_duration(more[1].full_run.seconds_p90)} on {more[0]} GPUs)"
        )
    raise BadInputError(
        f"{head}; no faster profile, fewer epochs, shorter max_length or more GPUs fits "
        "either: "
        "a longer window, more memory or faster hardware is needed"
    )


def probe_seconds(estimator: StudyEstimator) -> float:
    """The measure-before-refusing probe's budget: `PROBE_BEFORE_REFUSING_SECONDS`, or
    `PROBE_SHARE_OF_SEARCH` of the study's `search_hours` where that is less."""
    hours = estimator.config.budget.search_hours
    seconds = PROBE_BEFORE_REFUSING_SECONDS
    return seconds if not hours else min(seconds, PROBE_SHARE_OF_SEARCH * hours * 3600)


# TPE models good configurations from the trials that fit; while none fits it builds that
# model from the least infeasible ones and keeps proposing their neighbours, hundreds of
# refusals before one fits where little of the space does (docs/notes/tuned-constants.md).
# Where under this share of the candidates fits, the study starts with a few that fit.
FEASIBLE_SHARE_TO_SEED = 0.5
FEASIBLE_STARTS = 3


def feasible_starts(
    estimator: StudyEstimator, profiles: Sequence[str], *, seed: int, count: int = FEASIBLE_STARTS
) -> list[dict[str, Any]]:
    """Optuna parameters of up to `count` configurations whose full run fits, for a new
    study to try first (`study.enqueue_trial`): their time-relevant choices only, the rest
    is sampled. One per profile that has any first, drawn with `seed`. Empty when at least
    `FEASIBLE_SHARE_TO_SEED` of the candidates fit (the sampler finds them) or none does.
    """
    space = estimator.prepared.space
    every = list(candidates(space, profiles))
    fits = [params for params in every if estimator.verdict(params).feasible]
    if not fits or len(fits) >= FEASIBLE_SHARE_TO_SEED * len(every):
        return []
    random.Random(seed).shuffle(fits)
    chosen: list[dict[str, Any]] = []
    for params in fits:  # one per profile first, then any
        if all(params["profile"] != c["profile"] for c in chosen):
            chosen.append(params)
    chosen += [p for p in fits if p not in chosen]
    return [_trial_params(params, space) for params in chosen[:count]]


def _trial_params(params: Mapping[str, Any], space: SearchSpace) -> dict[str, Any]:
    """The sampler's names and values of a candidate's time-relevant choices."""
    profile = params["profile"]
    out: dict[str, Any] = {"profile": profile}
    for field in ("micro_batch_size", "gradient_accumulation_steps"):
        out[profile_param_name(field, profile)] = params[field]
    for key in ("lora_r", "packing", "quantization"):
        domain = space.domains.get(key)
        if isinstance(domain, Choice) and params[key] in domain.values:
            out[key] = params[key]
        elif isinstance(domain, IntRange) and params[key] == domain.low:
            out[key] = params[key]
    return out


class Proposals:
    """Judges a sampler's proposal (Optuna names) as the trial's check would, repairs one
    that does not fit (`hpo.feasible_sampler`), and says when nothing fits any more.

    Whether anything fits is known per calibration (`Coefficients.source`): a repair that
    found nothing scanned every candidate, and while that calibration stands (a refused
    trial measures nothing, so it stands) proposals are no longer judged or repaired.
    """

    def __init__(self, estimator: StudyEstimator, profiles: Sequence[str]) -> None:
        self.estimator = estimator
        self.space = estimator.prepared.space
        self.profiles = tuple(profiles)
        self.nearby = [(c, _trial_params(c, self.space)) for c in candidates(self.space, profiles)]
        self._nothing_fits: dict[str, bool] = {}  # by calibration

    def fits(self, trial_params: Mapping[str, Any]) -> bool | None:
        """Whether the proposal's full run fits; None when a time-relevant choice is missing
        or nothing fits by this calibration (no draw could)."""
        params = candidate_of(trial_params, self.space)
        if params is None or self._nothing_fits.get(self._source()):
            return None
        return self.estimator.verdict(params).feasible

    def repair(self, trial_params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The proposal with its time-relevant choices those of the nearest configuration
        that fits (fewest choices changed, the candidates' order among equals), the rest
        kept; None when nothing fits."""
        if candidate_of(trial_params, self.space) is None:
            return None

        def changed(named: Mapping[str, Any]) -> int:
            return sum(trial_params.get(key) != value for key, value in named.items())

        for params, named in sorted(self.nearby, key=lambda pair: changed(pair[1])):
            if changed(named) and self.estimator.verdict(params).feasible:
                return {**trial_params, **named}
        self._nothing_fits[self._source()] = True
        return None

    def nothing_fits(self) -> bool:
        """Whether no candidate fits by the current calibration (one scan per calibration)."""
        source = self._source()
        if source not in self._nothing_fits:
            self._nothing_fits[source] = not any(
                self.estimator.verdict(params).feasible for params, _ in self.nearby
            )
        return self._nothing_fits[source]

    def fastest(self) -> tuple[dict[str, Any], Verdict]:
        """The candidate with the lowest full-run p90 (Optuna names) and its verdict."""
        verdict, params = _fastest(self.estimator, self.profiles)
        return _trial_params(params, self.space), verdict

    def _source(self) -> str:
        return self.estimator.coefficients.source


def candidate_of(trial_params: Mapping[str, Any], space: SearchSpace) -> dict[str, Any] | None:
    """The candidate (see `candidates`) of a proposal's time-relevant choices, by their
    Optuna names; None when one of them is not in `trial_params`."""
    name = trial_params.get("profile")
    if name not in space.profiles:
        return None
    profile = space.profiles[name]
    fields = [profile_param_name(field, name) for field in PROFILE_FIELDS]
    keys = [key for key in ("lora_r", "packing", "quantization") if key in space.domains]
    if any(key not in trial_params for key in (*fields, *keys)):
        return None
    return {
        **TIME_NEUTRAL_PARAMS,
        "profile": name,
        "micro_batch_size": trial_params[fields[0]],
        "gradient_accumulation_steps": trial_params[fields[1]],
        "max_length": profile.length(),
        "gradient_checkpointing": profile.gradient_checkpointing,
        "lora_r": trial_params.get("lora_r", 8),  # as `candidates` without a rank domain
        **{key: trial_params.get(key, WORDS[key][0]) for key in ("packing", "quantization")},
    }


def candidates(space: SearchSpace, profiles: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Every time-relevant discrete choice of these profiles, as a complete configuration."""
    ranks = _values(space.domains.get("lora_r"), default=8)
    # Packing and a 4-bit base change steps, speed and memory: each value the space searches.
    words = [_words(space, key) for key in ("packing", "quantization")]
    # A searched GPU count moves time, memory and cost; without one the study's count holds.
    gpus: list[dict[str, int]] = [{}]
    if "gpus" in space.domains:
        gpus = [{"gpus": n} for n in _values(space.domains["gpus"], default=1)]
    for name, node in itertools.product(profiles, gpus):
        profile = space.profiles[name]
        for mb, ga, rank, packing, quantization in itertools.product(
            profile.micro_batch_size, profile.gradient_accumulation_steps, ranks, *words
        ):
            yield {
                **TIME_NEUTRAL_PARAMS,
                **node,
                "profile": name,
                "micro_batch_size": mb,
                "gradient_accumulation_steps": ga,
                "max_length": profile.length(),
                "gradient_checkpointing": profile.gradient_checkpointing,
                "lora_r": rank,
                "packing": packing,
                "quantization": quantization,
            }


def _words(space: SearchSpace, key: str) -> tuple[str, ...]:
    """The values of a word key the space searches (the trainer's default when it has none)."""
    domain = space.domains.get(key)
    return tuple(map(str, domain.values)) if isinstance(domain, Choice) else (WORDS[key][0],)


def _fastest(
    estimator: StudyEstimator, profiles: Sequence[str], **plan_changes: Any
) -> tuple[Verdict, dict[str, Any]]:
    """The feasible candidate with the lowest p90, else the fastest one, and its verdict."""
    best: tuple[tuple[bool, float], Verdict, dict[str, Any]] | None = None
    for params in candidates(estimator.prepared.space, profiles):
        verdict = estimator.verdict(params, **plan_changes)
        key = (not verdict.feasible, verdict.full_run.seconds_p90)
        if best is None or key < best[0]:
            best = (key, verdict, params)
    if best is None:
        raise BadInputError(f"profiles: {list(profiles)} offer no configuration")
    return best[1], best[2]


def _more_gpus(estimator: StudyEstimator, profiles: Sequence[str]) -> tuple[int, Verdict] | None:
    """The fewest GPUs per full run, of `GPU_COUNTS` above the study's, at which something
    fits, and the fastest's verdict there."""
    space = estimator.prepared.space.domains.get("gpus")
    most = max(estimator.config.budget.gpus_per_run, *_values(space, default=1))
    for gpus in GPU_COUNTS:
        if gpus <= most:
            continue
        verdict, _ = _fastest(estimator, profiles, gpus=gpus)
        if verdict.feasible:
            return gpus, verdict
    return None


def _most_epochs(estimator: StudyEstimator, profiles: Sequence[str]) -> float | None:
    """The largest epoch count (2 significant digits, rounded down) that fits, if any."""
    low, high = estimator.config.full_run.epochs * 1e-4, estimator.config.full_run.epochs
    if not _fastest(estimator, profiles, epochs=low)[0].feasible:
        return None
    for _ in range(30):  # bisection in log space: low fits, high does not
        middle = math.sqrt(low * high)
        if _fastest(estimator, profiles, epochs=middle)[0].feasible:
            low = middle
        else:
            high = middle
    digits = 1 - math.floor(math.log10(low))
    rounded = math.floor(low * 10**digits) / 10**digits
    return rounded if rounded > 0 else None


def _shorter_max_length(
    estimator: StudyEstimator, profiles: Sequence[str]
) -> tuple[int, str] | None:
    """The longest max_length (halving from the longest) at which something fits."""
    space = estimator.prepared.space
    length = max(space.profiles[name].length() for name in profiles) // 2
    while length >= 16:
        longer = [n for n in profiles if space.profiles[n].length() > length]
        verdict, params = _fastest(estimator, longer, max_length=length)
        if verdict.feasible:
            return length, str(params["profile"])
        length //= 2
    return None


def _values(domain: object, *, default: int) -> tuple[int, ...]:
    """The integer choices of a discrete domain; a range's two ends (time is monotone)."""
    if isinstance(domain, Choice):
        return tuple(int(v) for v in domain.values if isinstance(v, (int, float)))
    if isinstance(domain, IntRange):
        return (domain.low, domain.high)
    return (default,)


def _worth_measuring(estimator: StudyEstimator, verdict: Verdict) -> bool:
    """Priors only, within memory, and the duration's p10 within `PRIOR_MAX_PESSIMISM` of
    the window."""
    return (
        not estimator.calibrated
        and verdict.constraints.get("memory", 0.0) <= 0
        and verdict.full_run.seconds_p10 <= PRIOR_MAX_PESSIMISM * estimator.available_seconds
    )


def _describe(params: Mapping[str, Any]) -> str:
    return (
        f"profile {params['profile']}, micro_batch_size {params['micro_batch_size']}, "
        f"accumulation {params['gradient_accumulation_steps']}, lora_r {params['lora_r']}"
        + "".join(
            f", {key} {params[key]}" for key in WORDS if params.get(key, WORDS[key][0]) != "none"
        )
    )
