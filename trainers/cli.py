"""Exit-code discipline shared by every command line of the project.

0 success, 2 bad input (one line on stderr, no traceback), 1 anything else.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers.errors import BadInputError, HpoError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Call `main` and turn the project's errors into exit codes."""
    try:
        return main(argv)
    except BadInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except HpoError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def write_atomic(path: str | Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never half of it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, payload: Any) -> None:
    write_atomic(path, json.dumps(payload, indent=2, default=str) + "\n")


def check_writable(path: str | Path) -> None:
    """Fail early (bad input) when an output file cannot be written."""
    parent = Path(path).resolve().parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise BadInputError(f"cannot write {path}: {probe} is not writable")
