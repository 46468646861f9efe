"""Retry for the schema race of workers that share one database.

Workers started together on an empty database (an Optuna storage, an MLflow tracking store)
race to create its tables, or the same experiment; the loser gets a duplicate-key or
already-exists error and simply finds the winner's work there on a second look.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Another worker may be midway through creating the schema (MLflow migrates for seconds).
SCHEMA_RACE_ATTEMPTS = 10


def lost_schema_race(exc: BaseException) -> bool:
    """Whether `exc` is another worker having created a table or row first (PostgreSQL:
    duplicate key; SQLite: UNIQUE constraint failed, as when two workers log one dataset)."""
    text = str(exc).lower()
    return any(sign in text for sign in ("duplicate", "already exists", "unique constraint failed"))


def retry_schema_race(
    fn: Callable[[], T],
    *,
    attempts: int = SCHEMA_RACE_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn` until it does not lose the schema race, backing off a little more each time.

    Args:
        fn: The set-up step (open the store, get or create an experiment).
        attempts: Calls at most.
        sleep: Waits between calls (injected by tests).

    Returns:
        What `fn` returned.

    Raises:
        ValueError: `attempts` is below 1.
        Exception: What `fn` raised when it is not the race, or on the last attempt.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, but got {attempts=}")
    for attempt in range(attempts - 1):
        try:
            return fn()
        except Exception as exc:
            if not lost_schema_race(exc):
                raise
            sleep(min(2.0, 0.5 * (attempt + 1)))
    return fn()
