"""The search space: which hyperparameters are tuned over which domains, and the profiles.

A space file is flat YAML, one entry per tuned key, plus an optional ``profiles:``
section that replaces the packaged profiles::

    profile: {choice: [fast, balanced]}
    learning_rate: {loguniform: [5.0e-5, 5.0e-3]}
    lora_r: {choice: [8, 16, 32]}
    lora_alpha_ratio: {choice: [1, 2]}
    lora_dropout: 0.05
    learning_rate_scaling: sqrt   # sqrt | linear | none
    reference_batch_size: 16
    packing: {choice: [none, padding_free]}
    quantization: {choice: [none, nf4]}

``gpus: {choice: [1, 2, 4, 8]}`` lets the search choose how many GPUs of one node each
configuration's full run trains on (data-parallel); the window, memory per GPU and the cost
(N x price x hours) are judged on that N. Without it, every full run uses the study's
``budget.gpus_per_run``.

``packing`` and ``quantization`` take the trainer's words (``trainers.spec``): ``none``,
``padding_free`` (samples packed into sequences of ``max_length``) or ``group_by_length``
(samples kept apart, each micro-batch of about one length), ``none`` or ``nf4`` (QLoRA's
4-bit base). A space without them trains unpacked on the full-precision base. A space's
``quantization`` is searched only where the study allows it (:func:`gate_quantization`).

With ``learning_rate_scaling`` the sampled ``learning_rate`` is a *base* rate at the
reference effective batch; a configuration trains with it scaled by
``(effective batch / reference_batch_size)`` to the power 1/2 (sqrt), 1 (linear) or 0 (none),
so the range stays sensible whichever batch the profile gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from common.errors import BadInputError
from common.files import read_yaml
from search_spaces.domains import Choice, Domain, IntRange, as_number, domain_values, parse_domain
from search_spaces.profiles import Profile, parse_profiles


@dataclass(frozen=True)
class _Rule:
    """What values make sense for a known key: a range, whole numbers or not."""

    low: float
    high: float
    integer: bool = False
    open_low: bool = False
    open_high: bool = False
    required: bool = True

    def describe(self) -> str:
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        kind = "whole numbers" if self.integer else "numbers"
        return f"{kind} in {left}{self.low:g}, {self.high:g}{right}"

    def admits(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return above and below and (not self.integer or value == int(value))


RULES: dict[str, _Rule] = {
    "learning_rate": _Rule(0.0, 1.0, open_low=True),
    "lora_r": _Rule(1, 4096, integer=True),
    "lora_alpha_ratio": _Rule(0.0, 64.0, open_low=True),
    "lora_dropout": _Rule(0.0, 1.0, open_high=True),
    "weight_decay": _Rule(0.0, 1.0, required=False),
    "warmup_ratio": _Rule(0.0, 1.0, open_high=True, required=False),
    # GPUs the full run trains on, data-parallel on one node: searched only where the
    # space names it (the study's `budget.gpus_per_run` otherwise). Per-GPU batch and
    # accumulation stay the profile's, so N is part of the effective batch: a trial trains
    # on one GPU with the accumulation x N and stays the start of its full run.
    "gpus": _Rule(1, 64, integer=True, required=False),
}
LR_SCALINGS = ("sqrt", "linear", "none")
# Measured on the tiny model (benchmarks/lr_scaling.py, docs/benchmarks/lr_scaling.md): neither sqrt nor linear
# scaling beat none (paired over 3 seeds, fresh and pre-trained model; in every draw the mode
# that gave the higher rate won), so the sampled rate is used as it is unless a space asks.
DEFAULT_LR_SCALING = "none"
DEFAULT_REFERENCE_BATCH_SIZE = 16
SETTINGS = ("learning_rate_scaling", "reference_batch_size")  # plain values, not domains
# Keys whose values are words; the same words as trainers.spec's PACKING_MODES and
# QUANTIZATION_MODES (tests/test_search_space.py holds them equal), the first one the default.
WORDS: dict[str, tuple[str, ...]] = {
    "packing": ("none", "padding_free", "group_by_length"),
    "quantization": ("none", "nf4"),
}
KNOWN_KEYS = ("profile", *RULES, *WORDS, *SETTINGS)


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space.

    Attributes:
        domains: Domain of every tuned key except ``profile``, in file order.
        profiles: Every defined profile by name.
        profile_names: The profiles the search chooses from, in file order.
        learning_rate_scaling: How the sampled (base) learning rate scales with the
            effective batch: sqrt | linear | none.
        reference_batch_size: The effective batch the base learning rate is sampled for.
    """

    domains: dict[str, Domain]
    profiles: dict[str, Profile]
    profile_names: tuple[str, ...]
    learning_rate_scaling: str = DEFAULT_LR_SCALING
    reference_batch_size: int = DEFAULT_REFERENCE_BATCH_SIZE

    def with_max_length(self, max_length: int) -> SearchSpace:
        """The space with `max_length` for every profile that names none (the study's
        training length); profiles with their own keep it."""
        profiles = {
            name: profile
            if profile.max_length is not None
            else dataclasses.replace(profile, max_length=max_length, length_from_study=True)
            for name, profile in self.profiles.items()
        }
        return dataclasses.replace(self, profiles=profiles)

    def learning_rate_factor(self, effective_batch_size: int) -> float:
        """What the base learning rate is multiplied by at `effective_batch_size`."""
        ratio = effective_batch_size / self.reference_batch_size
        power = {"sqrt": 0.5, "linear": 1.0, "none": 0.0}[self.learning_rate_scaling]
        return float(ratio**power)


def _packaged(name: str) -> Path:
    return Path(str(resources.files("search_spaces").joinpath(name)))


def _family_targets(value: object) -> None:
    """Accept a family file's `lora_targets` in a space file (a copy of one whose ranges were
    edited), refuse any other list: a space file neither tunes nor sets LoRA's modules (every
    trial adapts all linear layers, which each family file lists), and an edited list would
    be ignored.

    Raises:
        BadInputError: Not the list of a shipped family.
    """
    # The files are read, not `search_spaces.families` imported: that package loads spaces.
    families = sorted(Path(str(resources.files("search_spaces"))).joinpath("families").glob("*.yaml"))
    lists = [read_yaml(path).get("lora_targets") for path in families]
    names = list(value) if isinstance(value, (list, tuple)) else value
    if names not in lists:
        raise BadInputError(
            f"lora_targets: {value!r} is not a family file's list; a space file does not "
            "choose LoRA's modules (every trial adapts all linear layers): delete the line"
        )


def load_space(
    path: str | Path | None = None, *, profiles_path: str | Path | None = None
) -> SearchSpace:
    """Loads and validates a search space file.

    Args:
        path: The space file; None means the packaged ``search_spaces/default.yaml``.
        profiles_path: A file with a ``profiles:`` section. None means the space file's own
            ``profiles:`` section if it has one, else the packaged ``profiles.yaml``.

    Returns:
        The search space.

    Raises:
        BadInputError: Missing file, bad YAML, or any invalid entry (the message names the
            file and the entry), or profiles given both in the space file and by
            ``profiles_path``.
    """
    space_file = Path(path) if path is not None else _packaged("default.yaml")
    raw = read_yaml(space_file, mapping=False)
    own_profiles = isinstance(raw, Mapping) and "profiles" in raw
    if own_profiles and profiles_path is not None:
        raise BadInputError(
            f"{space_file}: has a profiles section and profiles_path={str(profiles_path)!r} was "
            "given too; use one"
        )
    profiles_data = None
    if not own_profiles:
        profiles_file = Path(profiles_path) if profiles_path else _packaged("profiles.yaml")
        profiles_raw = read_yaml(profiles_file, mapping=False)
        if not isinstance(profiles_raw, Mapping) or set(profiles_raw) != {"profiles"}:
            raise BadInputError(f"{profiles_file}: expected one top-level key 'profiles'")
        try:
            profiles_data = parse_profiles(profiles_raw["profiles"])
        except BadInputError as error:
            raise BadInputError(f"{profiles_file}: {error}") from None
    try:
        return parse_space(raw, profiles=profiles_data)
    except BadInputError as error:
        raise BadInputError(f"{space_file}: {error}") from None


def parse_space(raw: Any, *, profiles: Mapping[str, Profile] | None = None) -> SearchSpace:
    """Validates a space given as data (what ``yaml.safe_load`` returns).

    Args:
        raw: A mapping of key to domain, optionally with a ``profiles:`` section.
        profiles: Profiles to use when ``raw`` has no ``profiles:`` section.

    Returns:
        The search space.

    Raises:
        BadInputError: An unknown or missing key, a bad domain or a bad profile.
    """
    if not isinstance(raw, Mapping):
        raise BadInputError(f"expected a mapping of hyperparameter to domain, but got {raw!r}")
    entries = dict(raw)
    if "profiles" in entries:
        profiles = parse_profiles(entries.pop("profiles"))
    if not profiles:
        raise BadInputError("no profiles: add a profiles section or pass profiles")
    if "lora_targets" in entries:
        _family_targets(entries.pop("lora_targets"))
    unknown = [str(key) for key in entries if key not in KNOWN_KEYS]
    if unknown:
        raise BadInputError(
            f"unknown key(s) {', '.join(unknown)}; known: {', '.join(KNOWN_KEYS)} "
            "(micro_batch_size and gradient_accumulation_steps come from the profiles)"
        )
    missing = [key for key, rule in RULES.items() if rule.required and key not in entries]
    if missing:
        raise BadInputError(f"missing key(s) {', '.join(missing)}")
    profile_names = _profile_names(entries.get("profile", list(profiles)), profiles)
    settings = _lr_settings(entries)
    domains = {
        key: _checked(key, value)
        for key, value in entries.items()
        if key != "profile" and key not in SETTINGS
    }
    return SearchSpace(domains, dict(profiles), profile_names, *settings)


def _lr_settings(entries: Mapping[str, Any]) -> tuple[str, int]:
    """``learning_rate_scaling`` and ``reference_batch_size``, checked."""
    scaling = entries.get("learning_rate_scaling", DEFAULT_LR_SCALING)
    if scaling not in LR_SCALINGS:
        raise BadInputError(
            f"learning_rate_scaling: must be one of {', '.join(LR_SCALINGS)}, but got {scaling!r}"
        )
    reference = entries.get("reference_batch_size", DEFAULT_REFERENCE_BATCH_SIZE)
    if isinstance(reference, bool) or not isinstance(reference, int) or reference < 1:
        raise BadInputError(
            f"reference_batch_size: must be a whole number >= 1, but got {reference!r}"
        )
    return str(scaling), reference


def _profile_names(raw: Any, profiles: Mapping[str, Profile]) -> tuple[str, ...]:
    domain = parse_domain("profile", {"choice": raw} if isinstance(raw, list) else raw)
    if not isinstance(domain, Choice):
        raise BadInputError(f"profile: expected {{choice: [profile names]}}, but got {raw!r}")
    for name in domain.values:
        if not isinstance(name, str) or name not in profiles:
            raise BadInputError(f"profile: unknown profile {name!r}; known: {', '.join(profiles)}")
    return tuple(str(name) for name in domain.values)


def gate_quantization(space: SearchSpace, *, allowed: bool) -> SearchSpace:
    """The space a study searches: its ``quantization`` kept only where it is `allowed`.

    A 4-bit base trains slower and scores differently; a study proposes it only where the
    full-precision base does not fit the device or the user asked for it. Otherwise the
    key is dropped (every trial trains on the full-precision base).
    """
    if allowed or "quantization" not in space.domains:
        return space
    domains = {key: domain for key, domain in space.domains.items() if key != "quantization"}
    return dataclasses.replace(space, domains=domains)


def _checked(key: str, raw: Any) -> Domain:
    """Parses a known key's domain and checks every value it can produce against the key's rule."""
    if key in WORDS:
        return _words(key, raw)
    rule = RULES[key]
    domain = parse_domain(key, raw)
    if isinstance(domain, Choice):
        numbers = tuple(as_number(key, value) for value in domain.values)
        if rule.integer:
            numbers = tuple(int(value) if value == int(value) else value for value in numbers)
        domain = Choice(numbers)
    elif rule.integer and not isinstance(domain, IntRange):
        raise BadInputError(f"{key}: needs {{int: ...}} or {{choice: ...}}, but got {raw!r}")
    for value in domain_values(domain):
        if not rule.admits(value):
            raise BadInputError(f"{key}: values must be {rule.describe()}, but got {raw!r}")
    return domain


def _words(key: str, raw: Any) -> Choice:
    """A word key's domain: a choice (or one fixed value) among the key's words."""
    domain = parse_domain(key, raw)
    words = WORDS[key]
    if not isinstance(domain, Choice) or any(value not in words for value in domain.values):
        raise BadInputError(f"{key}: values must be among {', '.join(words)}, but got {raw!r}")
    return domain
