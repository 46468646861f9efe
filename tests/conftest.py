"""Shared fixtures: the tiny model, built once per test session, and the real servers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# `tests.servers` and `benchmarks` import from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# No hub at test time: everything loads from local folders.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Under `pytest -n` (make test) each worker is one of several processes on the cores: a torch
# that also spread over every core would make them fight for them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.servers import MlflowServer, postgres_server  # noqa: E402  (after the path)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core, at most 4 (each starts its own servers and models)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cores or 1))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama-architecture xs model with its tokenizer, saved with save_pretrained."""
    from trainers.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "llama-xs", arch="llama", size="xs")


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 prompt/completion records of the bundled data: tokenized in a moment for each run."""
    from tests.configs import demo_records

    return demo_records(tmp_path_factory.mktemp("data") / "data.jsonl", 200)


@pytest.fixture(scope="module")
def _module_tracking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("server-root"))
    server.start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def tracking_server(_module_tracking_server: MlflowServer) -> MlflowServer:
    """A real `mlflow server` shared by a test module, answering when each test starts.

    A test may kill it (an outage) and start it again; one that leaves it down gets it
    started again for the next test, with the same store and port.
    """
    if _module_tracking_server.proc is None:
        _module_tracking_server.start()
    return _module_tracking_server


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throw-away PostgreSQL cluster shared by a test module: its server URL."""
    with postgres_server(tmp_path_factory.mktemp("pg")) as url:
        yield url
