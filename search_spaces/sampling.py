"""Drawing one configuration from a search space with an Optuna trial.

Sampling is conditional: the profile first, then the micro-batch size and gradient
accumulation among *that profile's* choices. Optuna forbids one parameter name with
different categorical choices, so those two are suggested under per-profile names
(``micro_batch_size@fast``) and mapped back to plain names in the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from common.errors import BadInputError
from search_spaces.domains import suggest
from search_spaces.space import WORDS, SearchSpace

if TYPE_CHECKING:
    import optuna

PROFILE_FIELDS = ("micro_batch_size", "gradient_accumulation_steps")


def profile_param_name(field: str, profile: str) -> str:
    """The Optuna parameter name of a per-profile field (``micro_batch_size@fast``)."""
    return f"{field}@{profile}"


def sample(
    trial: optuna.Trial,
    space: SearchSpace,
    allowed_profiles: Sequence[str] | None = None,
    gpus: int = 1,
) -> dict[str, Any]:
    """Suggests one configuration from ``space``.

    Args:
        trial: The trial that records the suggestions.
        space: The search space.
        allowed_profiles: Restricts the profile to these names (e.g. those that fit the
            time window). The profile is suggested over the space's profiles that are in
            this list, in the space's order, so every trial of a study must get the same
            list: Optuna rejects a categorical whose choices change within a study.
        gpus: GPUs the full run trains on where the space does not search them (the
            study's ``budget.gpus_per_run``): part of the effective batch.

    Returns:
        The flat configuration: ``profile``, ``micro_batch_size``,
        ``gradient_accumulation_steps``, ``max_length``, ``gradient_checkpointing``,
        ``packing`` and ``quantization`` (``none`` where the space has no such key) and
        every tuned key, with ``lora_alpha = lora_alpha_ratio * lora_r`` added, and
        ``base_learning_rate`` (the sampled rate, at the space's reference effective batch)
        beside ``learning_rate`` (the rate the configuration trains with, scaled to its
        effective batch by the space's ``learning_rate_scaling``).

    Raises:
        BadInputError: ``allowed_profiles`` is empty, names a profile the space does not
            choose from, or differs from the list earlier trials of the study used.
    """
    names = space.profile_names
    if allowed_profiles is not None:
        unknown = [name for name in allowed_profiles if name not in names]
        if unknown or not allowed_profiles:
            raise BadInputError(
                f"allowed_profiles: {list(allowed_profiles)!r} must be a non-empty subset of "
                f"the space's profiles {list(names)!r}"
            )
        names = tuple(name for name in names if name in allowed_profiles)
    try:
        profile = trial.suggest_categorical("profile", names)
    except ValueError as error:
        raise BadInputError(
            f"allowed_profiles: {list(names)!r} differs from the profiles earlier trials of "
            f"this study chose from ({error}); keep one list per study"
        ) from None
    params: dict[str, Any] = {"profile": profile}
    for field in PROFILE_FIELDS:
        name = profile_param_name(field, profile)
        params[name] = trial.suggest_categorical(name, getattr(space.profiles[profile], field))
    for key, domain in space.domains.items():
        params[key] = suggest(trial, key, domain)
    return params_from_trial_params(params, space, gpus)


def params_from_trial_params(
    trial_params: Mapping[str, Any], space: SearchSpace, gpus: int = 1
) -> dict[str, Any]:
    """Rebuilds the flat configuration :func:`sample` returned from a trial's ``params``.

    Args:
        trial_params: ``FrozenTrial.params`` of a trial sampled from ``space``.
        space: The space the trial was sampled from.
        gpus: GPUs of the full run where the space does not search them (as for :func:`sample`).

    Returns:
        The same flat dict :func:`sample` returned for that trial.

    Raises:
        BadInputError: The parameters do not come from this space (a missing parameter or
            an unknown profile).
    """
    profile_name = trial_params.get("profile")
    if profile_name not in space.profiles:
        raise BadInputError(
            f"trial params: profile {profile_name!r} is not one of {list(space.profiles)!r}"
        )
    profile = space.profiles[profile_name]
    names = [profile_param_name(field, profile.name) for field in PROFILE_FIELDS]
    missing = [name for name in [*names, *space.domains] if name not in trial_params]
    if missing:
        raise BadInputError(
            f"trial params: missing {', '.join(missing)}; was the trial sampled from this space?"
        )
    config: dict[str, Any] = {
        "profile": profile.name,
        "micro_batch_size": trial_params[names[0]],
        "gradient_accumulation_steps": trial_params[names[1]],
        "max_length": profile.length(),
        "gradient_checkpointing": profile.gradient_checkpointing,
    }
    config.update({key: trial_params[key] for key in space.domains})
    for key, words in WORDS.items():  # a space without the key: the trainer's default
        config.setdefault(key, words[0])
    alpha = config["lora_alpha_ratio"] * config["lora_r"]
    config["lora_alpha"] = int(alpha) if float(alpha).is_integer() else alpha
    effective = int(config["micro_batch_size"]) * int(config["gradient_accumulation_steps"])
    # Every GPU of the full run adds its micro-batches to the step (its trial on one GPU
    # accumulates N times as many): a searched count, else the study's.
    effective *= int(config.get("gpus", gpus))
    base = float(config["learning_rate"])
    config["base_learning_rate"] = base
    config["learning_rate"] = base * space.learning_rate_factor(effective)
    config["learning_rate_scaling"] = space.learning_rate_scaling
    return config
