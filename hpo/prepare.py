"""Before anything is written: resolve the model and data, load the space, tokenize once.

Bad input stops here, before a study or an MLflow run exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import BadInputError
from hpo.config import StudyConfig
from search_spaces import SearchSpace, load_space


@dataclass
class Prepared:
    """Everything checked before anything is written."""

    model_path: str
    data_path: str
    space: SearchSpace
    train_samples: int
    dataset_stats: dict[int, Any]  # max_length -> trainers.data.dataset.DatasetStats


def prepare(config: StudyConfig) -> Prepared:
    """Resolve the model and data, load the space and tokenize the data once per max_length.

    Bad input stops here, before a study or an MLflow run exists.
    """
    from trainers.data.dataset import DataSpec, demo_data_path, load_tokenized
    from trainers.model.lora import load_tokenizer
    from trainers.tiny import default_tiny_model

    space = load_space(config.space)
    allowed = config.profiles or tuple(space.profile_names)
    unknown = [p for p in allowed if p not in space.profile_names]
    if unknown:
        raise BadInputError(
            f"profiles: unknown profile(s) {', '.join(unknown)}; known: {', '.join(space.profile_names)}"
        )
    work = Path(config.work_dir).resolve()
    model_path = config.model or str(default_tiny_model(work / "models"))
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
                seed=config.seed,
                cache_dir=str(work / "cache"),
            ),
            tokenizer,
        )
        stats[max_length] = data.stats
        train_samples = len(data.train)
    return Prepared(
        model_path=str(Path(model_path).resolve()),
        data_path=str(Path(data_path).resolve()),
        space=space,
        train_samples=train_samples,
        dataset_stats=stats,
    )
