"""Before anything is written: resolve the model and data, load the space, tokenize once.

Bad input stops here, before a study or an MLflow run exists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import BadInputError
from common.workdir import WorkDir
from hpo.config import StudyConfig
from search_spaces import SearchSpace, load_space
from search_spaces.families import describe_choice, space_for_model_type

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """Everything checked before anything is written."""

    model_path: str
    data_path: str
    space: SearchSpace
    train_samples: int
    dataset_stats: dict[int, Any]  # max_length -> trainers.data.dataset.DatasetStats
    eval_max_length: int  # the one validation length of every run of the study
    max_length: int | None = None  # the study's training length (profiles without their own)
    length_given: bool = False  # by the study's max_length; else the data's
    data_length: int | None = None  # the data's p99 token length, within the model's context
    context: int | None = None  # the model's
    cuts: tuple[LengthCut, ...] = ()  # what each training length cuts


@dataclass(frozen=True)
class LengthCut:
    """What one training length of a study cuts of its data."""

    max_length: int
    profiles: tuple[str, ...]  # the profiles that name this length themselves
    study: bool  # the study's length (the profiles without one of their own train at it)
    samples: int  # train and validation records
    cut: int  # of them, longer than max_length
    without_target: int  # of those, left with no target token

    def line(self, prepared: Prepared) -> str:
        """One line for the study's start: the length, where it comes from, what it cuts."""
        whose = []
        if self.study:
            whose.append(
                "the study's max_length" if prepared.length_given
                else "the data's p99 token length (--max-length sets another)"
            )
        if self.profiles:
            names = ", ".join(f"'{p}'" for p in self.profiles)
            many = len(self.profiles) > 1
            whose.append(f"profile{'s' if many else ''} {names} name{'' if many else 's'} it")
        text = (
            f"training at max_length {self.max_length:,} tokens, {' and '.join(whose)}: "
            f"{self.cut:,} of {self.samples:,} samples cut ({100 * self.share:.1f} %)"
        )
        if self.without_target:
            text += f", {self.without_target:,} of them left with no token to learn"
        return text

    @property
    def share(self) -> float:
        return self.cut / max(self.samples, 1)


def prepare(config: StudyConfig) -> Prepared:
    """Resolve the model and data, load the space and tokenize the data once per max_length.

    Bad input stops here, before a study or an MLflow run exists.
    """
    from trainers.data.dataset import DataSpec, demo_data_path, load_tokenized
    from trainers.model.lora import load_tokenizer
    from trainers.tiny import default_tiny_model

    given_space = load_space(config.space) if config.space else None
    work = WorkDir(config.work_dir)
    if config.model is None and config.data:
        # The default tiny model is built (and its progress shown) before its tokenizer reads
        # the data: bad data is refused first, in one line (read again below, tokenized).
        from trainers.data.records import read_native
        from trainers.data.sources import open_source, with_columns

        read_native(with_columns(open_source(config.data), config.data_columns))
    model_path = config.model or str(default_tiny_model(work.models))
    model_type = family_model_type(model_path)
    space = given_space or space_for_model_type(model_type)
    log.info("%s", describe_choice(model_type, config.space))
    if "gpus" in space.domains and config.budget.gpus_per_run > 1:
        raise BadInputError(
            f"budget.gpus_per_run {config.budget.gpus_per_run} and the space's gpus both set "
            "the full run's GPU count: keep one (the space's to search it)"
        )
    allowed = config.profiles or tuple(space.profile_names)
    unknown = [p for p in allowed if p not in space.profile_names]
    if unknown:
        raise BadInputError(
            f"profiles: unknown profile(s) {', '.join(unknown)}; known: {', '.join(space.profile_names)}"
        )
    data_path = config.data or str(demo_data_path("prompt_completion"))
    tokenizer = load_tokenizer(model_path)
    context = model_context(model_path)

    def spec_at(max_length: int) -> DataSpec:
        return DataSpec(
            path=data_path,
            max_length=max_length,
            validation_fraction=config.validation_fraction,
            validation_split=config.validation_split,
            data_columns=config.data_columns,
            seed=config.seed,
            cache_dir=str(work.cache),
        )

    if config.max_length is not None and config.max_length > context:  # before any cache
        raise BadInputError(
            f"max_length: {config.max_length:,} tokens is beyond the model's context of "
            f"{context:,} tokens"
        )
    data_length = _long_tail_length(spec_at(context), tokenizer)
    # The study's training length: given, or the data's own (its p99), so that a profile
    # without a length of its own trains the samples whole, as a user's full run would.
    length = config.max_length or data_length
    space = space.with_max_length(length)
    stats: dict[int, Any] = {}
    train_samples = 0
    cuts: list[LengthCut] = []
    for max_length in sorted({space.profiles[p].length() for p in allowed}):
        data = load_tokenized(spec_at(max_length), tokenizer)
        stats[max_length] = data.stats
        train_samples = len(data.train)
        at = [space.profiles[p] for p in allowed if space.profiles[p].length() == max_length]
        cuts.append(
            LengthCut(
                max_length=max_length,
                profiles=tuple(p.name for p in at if not p.length_from_study),
                study=any(p.length_from_study for p in at),
                samples=data.stats.records,
                cut=data.stats.truncated,
                without_target=_without_target(data.train + data.validation, max_length),
            )
        )
    return Prepared(
        model_path=str(Path(model_path).resolve()),
        data_path=str(Path(data_path).resolve()),
        space=space,
        train_samples=train_samples,
        dataset_stats=stats,
        eval_max_length=config.eval_max_length or data_length,
        max_length=length,
        length_given=config.max_length is not None,
        data_length=data_length,
        context=context,
        cuts=tuple(cuts),
    )


def _without_target(examples: Any, max_length: int) -> int:
    """How many cut samples (`max_length` tokens) keep no label to learn from."""
    from trainers.data.records import IGNORE_INDEX

    cut = (e for e in examples if len(e.input_ids) >= max_length)
    return sum(all(t == IGNORE_INDEX for t in e.labels) for e in cut)


def family_model_type(model_path: str) -> str:
    """The model_type whose family space (`search_spaces.families`) a study of it searches.

    A tiny model of `trainers.tiny` gets none (""): the family recipes' learning rates are
    for billions of parameters, not for a few hundred thousand.
    """
    from transformers import AutoConfig

    from trainers.tiny import RECIPE_FILE

    path = Path(model_path)
    if (path / RECIPE_FILE).is_file():
        return ""
    try:
        return str(AutoConfig.from_pretrained(model_path, local_files_only=True).model_type)
    except (OSError, ValueError):
        return ""  # loading the tokenizer next names what is wrong with the folder


def model_context(model_path: str) -> int:
    """The longest sequence the model takes (its config's position limit; 2048 if unknown)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    for name in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def _long_tail_length(spec: Any, tokenizer: Any) -> int:
    """The data's p99 token length (`trainers.data.dataset.long_tail_length`) within
    `spec.max_length`, the model's context."""
    from trainers.data.dataset import load_tokenized, long_tail_length

    return long_tail_length(load_tokenized(spec, tokenizer).stats.lengths, spec.max_length)
