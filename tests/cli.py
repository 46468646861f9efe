"""A project command run as a child process, the way a user types it: `python -m MODULE ARGS`.

`run_module` waits for it and returns the CompletedProcess (text, stdout and stderr
captured); `start_module` returns the running process, for tests that signal it, kill it or
run several at once. Every test keeps its own assertions on what comes back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def module_command(module: str, *args: str | Path) -> list[str]:
    """The argv of `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *(str(arg) for arg in args)]


def run_module(
    module: str, *args: str | Path, cwd: Path = ROOT, timeout: float = 300, **options: Any
) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args` in `cwd` to its end (`options`: env, stdin, ...)."""
    return subprocess.run(
        module_command(module, *args),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
        **options,
    )


def start_module(
    module: str, *args: str | Path, cwd: Path = ROOT, stdout: Any = subprocess.PIPE, **options: Any
) -> subprocess.Popen[str]:
    """Start `python -m module args` in `cwd`; stderr is piped, stdout too unless told."""
    return subprocess.Popen(
        module_command(module, *args),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        **options,
    )
