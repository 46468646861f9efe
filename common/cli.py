"""Exit-code discipline shared by every command line of the project.

0 success, 2 bad input (one line on stderr, no traceback), 1 anything else.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from common.errors import BadInputError, HpoError
from common.redact import redact, redact_log_records

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Call `main` and turn the project's errors into exit codes.

    Every message, log record and traceback passes through `redact` on its way out.
    """
    redact_log_records()
    # MLflow prints "View run ... at: URL" at every run's end: noise, and the URL may hold a
    # password.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    try:
        return main(argv)
    except BadInputError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except HpoError as exc:
        print(f"failed: {redact(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:  # a bug: the traceback helps, the password in it must not show
        print(redact(traceback.format_exc()), file=sys.stderr, end="")
        return EXIT_FAILED


def check_writable_dir(path: str | Path, what: str) -> None:
    """Fail early (bad input) when folder `path` cannot be created or written; creates nothing."""
    problem = _unwritable(Path(path))
    if problem:
        raise BadInputError(f"{what}: cannot {problem}")


def check_writable(path: str | Path) -> None:
    """Fail early (bad input) when output file `path` cannot be written; creates nothing."""
    target = Path(path)
    problem = (f"write {path}: it is a folder" if target.is_dir()
               else _unwritable(target.resolve().parent, shown=path))  # fmt: skip
    if problem:
        raise BadInputError(f"cannot {problem}")


def _unwritable(folder: Path, shown: str | Path | None = None) -> str:
    """Why `folder` cannot be created or written ('' when it can), naming it as `shown`.

    Probes the nearest existing ancestor with a temporary file, which also catches what
    `os.access` misses for root (read-only file systems, /proc).
    """
    shown = folder if shown is None else shown
    probe = folder.resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"create {shown}: {probe} is a file"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        return f"write {shown}: {probe}: {exc.strerror}"
    return ""
