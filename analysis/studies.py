"""Open an existing Optuna study for reading, with one-line errors a user can act on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import BadInputError
from common.redact import redact

if TYPE_CHECKING:
    import optuna


def load_study(
    study_name: str, storage: str, *, open_storage: Callable[[str], Any] | None = None
) -> optuna.Study:
    """Load study `study_name` from `storage` without creating anything.

    Optuna creates a missing SQLite file on first contact; a reader that only looks must not
    leave an empty database behind, so a missing file is an error before Optuna sees it.

    Args:
        study_name: The study's name.
        storage: Its storage URL (a password in it never reaches a message).
        open_storage: Opens the URL as an Optuna storage (its own errors pass unchanged);
            default: Optuna opens it.

    Returns:
        The study.

    Raises:
        BadInputError: No such database file or study, or the storage cannot be opened.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shown = redact(storage)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        raise BadInputError(f"no study named '{study_name}' in {shown}: no such database file")
    opened = open_storage(storage) if open_storage is not None else storage
    try:
        return optuna.load_study(study_name=study_name, storage=opened)
    except KeyError:
        raise BadInputError(f"no study named '{study_name}' in {shown}") from None
    except Exception as exc:  # SQLAlchemy/driver errors: a bad URL, an unreachable server
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInputError(f"cannot open storage {shown}: {redact(first)}") from None
