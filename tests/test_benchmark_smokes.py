"""Every benchmark's `--smoke`, run by the suite, so that none rots unseen.

A smoke is the benchmark's own code path end to end (real training steps, real studies, real
MLflow stores where the benchmark has them) at sizes that take seconds on a CPU, GPU-only
scripts included. Each run writes its JSON (the script's `main` called here, or the script
in its own process: `Smoke`), and the check reads back what the printed table shows: the
rows it should have, numbers that are finite and positive, the invariants the benchmark
exists to measure. `test_every_benchmark_has_a_smoke_the_suite_runs` fails when a script
under benchmarks/ has no `--smoke` or is missing here, so a new one cannot be added unseen.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli import ROOT, module_command

BENCHMARKS = ROOT / "benchmarks"


def positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def check_band_coverage(out: dict[str, Any]) -> None:
    assert len(out["files"]) == 2 and out["fractions"] == ["0.02"]
    for case, score in out["scores"].items():
        assert score["predictions"] == 16 and score["sets"] == 2, case  # 8 configurations a set
        assert 0 <= score["band_coverage"] <= 1 and positive(score["median_abs_pct_error"])
        assert 0 <= score["band_coverage_held_out"] <= 1  # the seed1 set is held out
    assert all(bound["rows"] == 2 for bound in out["bounds"].values())


def check_gpu_check(out: dict[str, Any]) -> None:
    assert out["device"] == "cpu" and positive(out["peak_flops"])
    assert all(positive(r) for r in out["throughput"]["ratios"])
    assert 0 < out["mfu"]["mfu"] < 1
    model = out["time_model"]
    assert model["probe_runs"] >= 3 and len(model["rows"]) == 2
    assert all(positive(r["measured_s"]) and positive(r["predicted_p50_s"]) for r in model["rows"])


def check_gpu_scale(out: dict[str, Any]) -> None:
    assert out["rows"] and not out["skipped"]
    for row in out["rows"]:
        assert positive(row["tokens_per_second"]) and positive(row["seconds_per_step"])
        assert row["plan_seconds_p10"] < row["plan_seconds_p50"]


def check_hpo_efficiency(out: dict[str, Any]) -> None:
    assert [r["method"] for r in out["rows"]] == ["hpo", "random"]
    assert positive(out["window_seconds"]) and out["space"]["configurations"] > 0
    for row in out["rows"]:
        assert "refused" in row or (row["trials"] > 0 and positive(row["search_seconds"]))
    random = out["rows"][1]
    assert positive(random["final_loss"])  # a peer always picks; its pick's full run ran


def check_lr_scaling(out: dict[str, Any]) -> None:
    from search_spaces.space import LR_SCALINGS

    assert set(out["summary"]) == set(LR_SCALINGS)
    assert len(out["runs"]) == len(LR_SCALINGS)  # one draw, paired across the modes
    assert all(positive(r["final_val_loss"]) for r in out["runs"])


def check_packing(out: dict[str, Any]) -> None:
    (result,) = out["results"]
    assert result["shape"] == "chat" and positive(result["median_ratio"])
    assert positive(result["packed_capacity"]) and positive(result["real_tokens"])


def check_parallel_workers(out: dict[str, Any]) -> None:
    assert [(p["phase"], p["workers"]) for p in out["phases"]] == [("kill", 2)]
    assert out["lost_records"] == 0 and out["duplicate_records"] == 0  # exactly once
    assert all(p["finished"] >= out["trials"] and p["parent_counts_equal_storage"]
               for p in out["phases"])  # fmt: skip


def check_preset_honesty(out: dict[str, Any]) -> None:
    (row,) = out["rows"]
    assert row["predicted_p10_s"] < row["predicted_p50_s"] < row["predicted_p90_s"]
    assert positive(row["measured_s"]) and positive(row["command_s"])
    assert out["summary"]["repeat_noise_pct"] is not None  # the preset ran twice


def check_published_runs(out: dict[str, Any]) -> None:
    assert out["summary"]["in_sample"]["points"] > 0 and out["summary"]["held_out"]["points"] > 0
    expressible = [r for r in out["rows"] if r["expressible"]]
    assert expressible and all(positive(r["plan_seconds_per_step"]["p50"]) for r in expressible)


def check_rank_fidelity(out: dict[str, Any]) -> None:
    assert len(out["rows"]) == 4
    assert all(positive(r["full_run_loss"]) for r in out["rows"])
    assert out["scores"] and all(r["trials"]["0.1"]["eval_records"] for r in out["rows"])


def check_time_model_accuracy(out: dict[str, Any]) -> None:
    assert len(out["rows"]) == 2 and out["probe_runs"] == 4
    assert positive(out["median_abs_pct_error"]) and 0 <= out["band_coverage"] <= 1
    assert all(r["predicted_p10_s"] < r["predicted_p90_s"] for r in out["rows"])


def check_time_model_shape(out: dict[str, Any]) -> None:
    assert len(out["rows"]) == 3 and len(out["levels"]) == out["rounds"] == 2
    assert all(positive(r) for r in out["run_ratios"]) and len(out["run_ratios"]) == 6


def check_tracking_overhead(out: dict[str, Any]) -> None:
    for mode in (out, out["system_metrics"], out["mlflowcallback"]):
        assert positive(mode["trial_ms"]) and positive(mode["overhead_ms_per_trial"])
    assert positive(out["untracked_trial_ms"])
    assert positive(out["background_store_ms_per_trial"])  # the trial's records reached the store


def check_trainer_throughput(out: dict[str, Any]) -> None:
    assert positive(out["ratio"]) and out["steps"] > out["warmup_steps_discarded"]
    assert positive(out["framework_tokens_per_second"][0])


def check_trial_overhead(out: dict[str, Any]) -> None:
    this = out["sizes"]["xs"]["this"]
    assert this["summaries"]["reuse"][0]["trained_trials"] >= 2
    assert 0 < this["overhead_share"] < 1 and positive(this["speedup"])
    # Keeping the base model changes where time goes, never a configuration or its value.
    assert out["sizes"]["xs"]["same_results_everywhere"]


@dataclasses.dataclass(frozen=True)
class Smoke:
    """How the suite runs a benchmark's smoke and what it checks in its JSON.

    `own_process`: as `python -m benchmarks.NAME`, for a benchmark that starts processes of
    its own or sets process-wide state (MLflow's active tracking URI, torch.compile); the
    others run their `main` here, which spares the 5 s of imports a process costs.
    """

    check: Callable[[dict[str, Any]], None]
    own_process: bool = False


# Script -> its smoke here, or the test file that runs its smoke.
SMOKES: dict[str, Smoke | str] = {
    "band_coverage": Smoke(check_band_coverage),
    "curve_replay": "tests/test_curve_replay.py",
    "gpu_check": Smoke(check_gpu_check, own_process=True),
    "gpu_lease": "tests/test_gpu_lease.py",  # its parts (benchmarks/lease/) with it
    "gpu_scale": Smoke(check_gpu_scale),
    "hpo_efficiency": Smoke(check_hpo_efficiency, own_process=True),
    "lr_scaling": Smoke(check_lr_scaling),
    "multi_gpu_scaling": "tests/test_multi_gpu_scaling.py",
    "packing": Smoke(check_packing),
    "parallel_workers": Smoke(check_parallel_workers, own_process=True),
    "preset_honesty": Smoke(check_preset_honesty, own_process=True),
    "published_runs": Smoke(check_published_runs),
    "rank_fidelity": Smoke(check_rank_fidelity),
    "time_model_accuracy": Smoke(check_time_model_accuracy),
    "time_model_refit": "tests/test_time_model_refit.py",
    "time_model_shape": Smoke(check_time_model_shape),
    "tracking_overhead": Smoke(check_tracking_overhead, own_process=True),
    "trainer_throughput": Smoke(check_trainer_throughput),
    "trial_overhead": Smoke(check_trial_overhead, own_process=True),
}
RUN_HERE = [name for name, smoke in SMOKES.items() if isinstance(smoke, Smoke)]


def test_every_benchmark_has_a_smoke_the_suite_runs() -> None:
    scripts = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
    assert scripts == sorted(SMOKES), "add the new benchmark's --smoke to SMOKES"
    for name in scripts:
        source = (BENCHMARKS / f"{name}.py").read_text(encoding="utf-8")
        # Its own flag, or the one `benchmarks._common.parse_with_smoke` adds.
        assert '"--smoke"' in source or "parse_with_smoke(" in source, (
            f"benchmarks/{name}.py has no --smoke"
        )
    for name, where in SMOKES.items():
        if isinstance(where, str):  # run elsewhere: that test names the script and --smoke
            text = (ROOT / where).read_text(encoding="utf-8")
            assert re.search(rf"benchmarks[./]{name}\b", text) and '"--smoke"' in text, where


@pytest.mark.parametrize("name", RUN_HERE)
def test_the_smoke_runs_and_writes_what_its_table_shows(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smoke = SMOKES[name]
    assert isinstance(smoke, Smoke)
    out = tmp_path / f"{name}.json"
    # From a folder of its own, as a user runs it from anywhere.
    monkeypatch.chdir(tmp_path)
    if smoke.own_process:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # 2 cores
        proc = subprocess.run(
            module_command(f"benchmarks.{name}", "--smoke", "--json", out),
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    else:
        main = importlib.import_module(f"benchmarks.{name}").main
        assert main(["--smoke", "--json", str(out)]) == 0
    smoke.check(json.loads(out.read_text(encoding="utf-8")))
