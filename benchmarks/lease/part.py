"""What every part of the lease shares: its flags, its JSON (rewritten as it grows), its clock.

A part is killed when its time is up, so whatever it measured must already be on disk:
`Record` rewrites the part's JSON atomically after every row, and the orchestrator reads
whatever is there.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.files import write_json  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every part takes (the orchestrator passes all of them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="this part's JSON file")
    parser.add_argument("--work", required=True, help="a folder shared by the lease's parts")
    parser.add_argument("--budget-seconds", type=float, default=600.0,
                        help="skip what would start after this")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    return parser


class Record:
    """A part's results, written to `path` after each change (atomically: never half a file)."""

    def __init__(self, path: str | Path, part: str, budget_seconds: float) -> None:
        self.path = Path(path)
        self.started = time.perf_counter()
        self.budget_seconds = budget_seconds
        self.data: dict[str, Any] = {"part": part, "status": "running"}
        self.save()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.budget_seconds - self.elapsed()

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def append(self, key: str, row: dict[str, Any]) -> None:
        self.data.setdefault(key, []).append(row)
        self.save()

    def skip(self, what: str) -> None:
        self.append("skipped", {"what": what, "at_seconds": round(self.elapsed(), 1)})

    def finish(self, status: str = "ok") -> None:
        """The part ran to its end; `status` says "ok" or what failed in it."""
        self.data["status"] = status
        self.data["seconds"] = self.elapsed()
        self.save()

    def save(self) -> None:
        self.data["seconds"] = self.elapsed()
        write_json(self.path, self.data)


def guarded(record: Record, key: str, step: Callable[[], Any]) -> Any:
    """Run `step`; a failure is recorded under `key` (its first line) and does not stop the part."""
    try:
        value = step()
    except Exception as exc:  # one check failing is a finding: the rest still runs
        record.set(key, {"error": first_line(exc)})
        return None
    record.set(key, value)
    return value


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def cuda_or_smoke(smoke: bool) -> str:
    """The device of the part: cuda, or cpu under --smoke; exit 2 without CUDA otherwise."""
    import torch

    from benchmarks.gpu_check import require_cuda

    require_cuda(smoke or torch.cuda.is_available(),
                 f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU")  # fmt: skip
    return "cpu" if smoke else "cuda"


def start(name: str, doc: str, argv: list[str] | None) -> tuple[argparse.Namespace, Record, Path]:
    """A training part's start: its flags, its record, its device checked, its work folder."""
    args = parser(doc.splitlines()[0]).parse_args(argv)
    record = Record(args.out, name, args.budget_seconds)
    cuda_or_smoke(args.smoke)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    return args, record, work


def median_seconds(run: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    """Median wall seconds of `run` over `repeats`, after one warm-up; `sync` before each read."""
    run()
    sync()
    times: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
