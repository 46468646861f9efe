"""Where the project keeps its caches and where the bundled demo data lies."""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import BadInputError

DEMO_DATA_DIR = Path(__file__).resolve().parent / "demo_data"
_DEMO_FILES = {
    "text": "text.jsonl",
    "prompt_completion": "prompt_completion.jsonl",
    "messages": "chat.jsonl",
}


def cache_root() -> Path:
    """Root of the project's caches: ``$HPO_CACHE_DIR`` if set, else ``~/.cache/hpo``.

    Tokenized data goes to ``<root>/tokenized``, tiny models to ``<root>/models``.
    """
    env = os.environ.get("HPO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hpo"


def demo_data_path(shape: str = "prompt_completion") -> Path:
    """Path of the bundled demo JSONL file of one record shape.

    Args:
        shape: ``"text"``, ``"prompt_completion"`` or ``"messages"`` (``"chat"`` is accepted
            as another name for ``"messages"``).

    Returns:
        The path of the file inside the installed ``trainers`` package.

    Raises:
        BadInputError: Unknown shape.
    """
    name = "messages" if shape == "chat" else shape
    if name not in _DEMO_FILES:
        raise BadInputError(
            f"demo data shape must be one of {sorted(_DEMO_FILES)}, but got {shape=}"
        )
    return DEMO_DATA_DIR / _DEMO_FILES[name]
