"""Search spaces per model family, picked from a model's ``model_type``.

Each ``<family>.yaml`` is a search space (the packaged profiles unless it has its own) whose
learning-rate, rank and dropout ranges follow published LoRA recipes for that family (cited
in the file), plus ``lora_targets``: the modules LoRA ``auto`` adapts in that family, which
``tests/test_families.py`` checks against the tiny model of the family.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from common.errors import BadInputError
from common.files import read_yaml
from search_spaces.space import SearchSpace, load_space, parse_space

# transformers' model_type -> family file. Types of one architecture share a family.
FAMILY_OF_MODEL_TYPE: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "phi3": "phi3",
    "gemma": "gemma",
    "mixtral": "mixtral",
}
FAMILIES = tuple(sorted(set(FAMILY_OF_MODEL_TYPE.values())))


def family_of(model_type: str) -> str | None:
    """The family of a transformers ``model_type``; None when no family file covers it."""
    return FAMILY_OF_MODEL_TYPE.get(model_type)


def family_path(family: str) -> Path:
    """The packaged space file of `family`.

    Raises:
        BadInputError: Not a known family.
    """
    if family not in FAMILIES:
        raise BadInputError(f"family must be one of {list(FAMILIES)}, but got {family=}")
    return Path(str(resources.files("search_spaces.families").joinpath(f"{family}.yaml")))


def _read(family: str) -> tuple[dict[str, object], tuple[str, ...]]:
    path = family_path(family)
    raw = read_yaml(path)
    targets = raw.pop("lora_targets", None)
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise BadInputError(f"{path}: lora_targets must be a list of module names")
    return raw, tuple(targets)


def lora_targets(family: str) -> tuple[str, ...]:
    """What LoRA ``auto`` adapts in `family` (leaf module names, "module.parameter" for a
    fused expert tensor)."""
    return _read(family)[1]


def load_family_space(family: str) -> SearchSpace:
    """The search space of `family`, with the packaged profiles unless it has its own."""
    raw, _ = _read(family)
    profiles = None if "profiles" in raw else load_space().profiles
    try:
        return parse_space(raw, profiles=profiles)
    except BadInputError as error:
        raise BadInputError(f"{family_path(family)}: {error}") from None


def space_for_model_type(model_type: str, space: str | Path | None = None) -> SearchSpace:
    """The space a study of a `model_type` model searches.

    Args:
        model_type: transformers' ``config.model_type``.
        space: A space file given by the user; it wins over the family's.

    Returns:
        The given space, else the family's, else the packaged default space.
    """
    if space is not None:
        return load_space(space)
    family = family_of(model_type)
    return load_family_space(family) if family else load_space()


def describe_choice(model_type: str, space: str | Path | None) -> str:
    """One line naming the space `space_for_model_type` picks, for logs."""
    if space is not None:
        return f"search space {space} (given)"
    family = family_of(model_type)
    if family:
        return f"search space of the {family} family ({family_path(family)})"
    if not model_type:
        return "default search space"
    return f"default search space (no family file for model_type {model_type!r})"


__all__ = [
    "FAMILIES",
    "FAMILY_OF_MODEL_TYPE",
    "describe_choice",
    "family_of",
    "family_path",
    "load_family_space",
    "lora_targets",
    "space_for_model_type",
]
