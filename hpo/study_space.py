"""A study keeps its search space: continuing a study name with another space is refused.

Optuna would go on sampling the stored study from the new space, and the study would mix
trials of two questions; the user gets told what differs and a free name instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from common.errors import BadInputError
from hpo.keys import SPACE_ATTR
from search_spaces.space import SearchSpace


def space_record(space: SearchSpace, profiles: tuple[str, ...] | None) -> dict[str, Any]:
    """The space as plain data: every tuned key's domain and the profiles allowed."""
    record: dict[str, Any] = {
        key: {"kind": type(domain).__name__, **dataclasses.asdict(domain)}
        for key, domain in space.domains.items()
    }
    allowed = profiles or space.profile_names
    record["profile"] = {
        name: {
            k: v
            for k, v in dataclasses.asdict(space.profiles[name]).items()
            if k not in ("description", "length_from_study")
        }
        for name in allowed
        if name in space.profiles
    }
    # YAML/JSON round trips turn tuples into lists; compare what the storage gives back.
    return _plain(record)


def check_same_space(study: optuna.Study, record: dict[str, Any]) -> None:
    """Record the study's space on first use; later, refuse another one.

    Raises:
        BadInputError: Naming the keys whose domains differ and a study name that is free.
    """
    stored = study.user_attrs.get(SPACE_ATTR)
    if stored is None:
        study.set_user_attr(SPACE_ATTR, record)
        return
    if stored == record:
        return
    keys = sorted(k for k in set(stored) | set(record) if stored.get(k) != record.get(k))
    free = _free_name(study)
    lengths = _lengths_only(stored, record)
    if lengths is not None and len(set(map(str, lengths[0].values()))) == 1:
        # The data's p99 moved (data added), or another --max-length: one flag continues it.
        raise BadInputError(
            f"study '{study.study_name}' trained its profiles at max_length "
            f"{_listed(lengths[0])}, this run at {_listed(lengths[1])}: continue it with "
            f"--max-length {next(iter(lengths[0].values()))}, or run a new study "
            f"(--study-name {free})"
        )
    if lengths is not None:
        # Each profile at its own length (a study made before profiles took the study's
        # length, or a space file's profiles): no one --max-length gives them back.
        raise BadInputError(
            f"study '{study.study_name}' trained each profile at its own max_length "
            f"({_listed(lengths[0])}), this run at {_listed(lengths[1])}: continue it with a "
            "space file (--space) whose profiles name those lengths (max_length: under each), "
            f"or run a new study (--study-name {free})"
        )
    raise BadInputError(
        f"study '{study.study_name}' exists with another search space (differs in: "
        f"{', '.join(keys)}); run this space as a new study (--study-name {free}) or give "
        "the original space to continue it"
    )


def _lengths_only(
    stored: dict[str, Any], record: dict[str, Any]
) -> tuple[dict[str, object], dict[str, object]] | None:
    """The stored and the new max_length of each profile whose length is all that differs
    (None where anything else does)."""
    if {k: v for k, v in stored.items() if k != "profile"} != {
        k: v for k, v in record.items() if k != "profile"
    }:
        return None
    before, now = stored.get("profile") or {}, record.get("profile") or {}
    if set(before) != set(now):
        return None
    if any(_but_length(before[n]) != _but_length(now[n]) for n in now):
        return None
    changed = sorted(n for n in now if before[n] != now[n])
    return (
        {n: before[n].get("max_length") for n in changed},
        {n: now[n].get("max_length") for n in changed},
    )


def _listed(lengths: dict[str, object]) -> str:
    """One length where every profile has it ("1184"), else each profile's ("fast 128,
    quality 512")."""
    if len(set(map(str, lengths.values()))) == 1:
        return str(next(iter(lengths.values())))
    return ", ".join(f"{name} {length}" for name, length in lengths.items())


def _but_length(profile: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in profile.items() if k != "max_length"}


def _free_name(study: optuna.Study) -> str:
    taken = set(optuna.get_all_study_names(storage=study._storage))
    number = 2
    while f"{study.study_name}-{number}" in taken:
        number += 1
    return f"{study.study_name}-{number}"


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
