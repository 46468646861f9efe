"""Before anything is written: resolve the model and data, load the space, tokenize once.

Bad input stops here, before a study or an MLflow run exists.
"""

from __future__ import annotations

import logging
import math
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
    stats: dict[int, Any] = {}
    train_samples = 0
    for max_length in sorted({space.profiles[p].max_length for p in allowed}):
        data = load_tokenized(
            DataSpec(
                path=data_path,
                max_length=max_length,
                validation_fraction=config.validation_fraction,
                validation_split=config.validation_split,
                data_columns=config.data_columns,
                seed=config.seed,
                cache_dir=str(work.cache),
            ),
            tokenizer,
        )
        stats[max_length] = data.stats
        train_samples = len(data.train)
    eval_length = config.eval_max_length or _long_tail_length(
        DataSpec(
            path=data_path,
            max_length=model_context(model_path),
            validation_fraction=config.validation_fraction,
            validation_split=config.validation_split,
            data_columns=config.data_columns,
            seed=config.seed,
            cache_dir=str(work.cache),
        ),
        tokenizer,
    )
    return Prepared(
        model_path=str(Path(model_path).resolve()),
        data_path=str(Path(data_path).resolve()),
        space=space,
        train_samples=train_samples,
        dataset_stats=stats,
        eval_max_length=eval_length,
    )


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
    """The data's p99 token length (rounded up to a multiple of 8), within the model's context.

    Validation samples are then cut only in the data's rare longest 1 %, whatever the
    profile's training `max_length`: every run of the study is scored on the same tokens.
    """
    import numpy as np

    from trainers.data.dataset import load_tokenized

    lengths = load_tokenized(spec, tokenizer).stats.lengths
    p99 = int(math.ceil(float(np.percentile(lengths, 99)))) if lengths else spec.max_length
    return int(min(spec.max_length, max(8, -(-p99 // 8) * 8)))
