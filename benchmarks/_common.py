"""Shared bits of the benchmarks: a results table and the JSON file."""

from __future__ import annotations

import argparse
import platform
import statistics
from collections.abc import Sequence
from typing import Any

from common import files


def machine() -> dict[str, Any]:
    import os

    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_cores": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def parse_with_smoke(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, about: str, **smoke: Any
) -> argparse.Namespace:
    """`argv` parsed with a `--smoke` flag beside `parser`'s own: tiny sizes, seconds, the real
    code path (`about` says what it runs; the suite runs it), `smoke` the values it sets."""
    parser.add_argument("--smoke", action="store_true", help=f"{about}: the suite runs it")
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(smoke)
    return args


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        files.write_json(path, payload)
        print(f"wrote {path}")


def write_results(path: str | None, payload: dict[str, Any]) -> None:
    """`payload` and, as its last key, the machine it was measured on (`write_json`)."""
    write_json(path, {**payload, "machine": machine()})


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)
