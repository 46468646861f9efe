"""Shared fixtures: the tiny model is built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# `tests.servers` and `benchmarks` import from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# No hub at test time: everything loads from local folders.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama-architecture xs model with its tokenizer, saved with save_pretrained."""
    from trainers.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "llama-xs", arch="llama", size="xs")
