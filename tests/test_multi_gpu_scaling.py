"""benchmarks/multi_gpu_scaling.py: the published DDP series against the N-GPU step."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.multi_gpu_scaling import DATA, predicted, seconds_by_gpus, spread_of

ROOT = Path(__file__).resolve().parent.parent


def test_a_series_spread_reproduces_its_own_row_and_grows_with_n() -> None:
    # k read off a row gives that row back; a positive k costs more on more GPUs.
    for gpus in (2, 4, 8):
        k = spread_of(100.0, 60.0, gpus)
        assert predicted(100.0, gpus, k) == pytest.approx(60.0)
    assert predicted(100.0, 8, 0.2) / (100 / 8) > predicted(100.0, 2, 0.2) / (100 / 2) > 1


def test_every_published_series_names_its_source_and_quote() -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    for series in data["series"]:
        assert series["source"] in data["sources"] and series["quote"]
        times = seconds_by_gpus(series)
        assert 1 in times and any(n > 1 for n in times)
        assert all(t > 0 for t in times.values())
    assert all(s["url"].startswith("https://") for s in data["sources"].values())


def test_the_smoke_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/multi_gpu_scaling.py"), "--smoke", "--json", out],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text(encoding="utf-8"))
    rows, summary = result["rows"], result["summary"]
    assert rows and all(r["gpus"] > 1 and r["others_p10"] <= r["others_p90"] for r in rows)
    assert summary["rows"] == len(rows) and 0.0 <= summary["others_inside"] <= 1.0
    assert math.isfinite(summary["from_2_gpus_median_abs_error"])
    assert summary["left_out"] and "other series:" in proc.stdout
