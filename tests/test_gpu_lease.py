"""The GPU lease's smoke: every part's code path at tiny sizes on the CPU, in one orchestrated
run (as the lease runs on a GPU), so that nothing in it rots between leases."""

from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
from pathlib import Path

import pytest

from benchmarks.gpu_lease import PARTS, Part, chosen, run_part, timeout_for
from common.errors import BadInputError
from tests.cli import run_module


def test_parts_are_chosen_in_the_lease_order() -> None:
    assert [p.name for p in chosen("time_model,preflight")] == ["preflight", "time_model"]
    with pytest.raises(BadInputError, match="--parts must name some of"):
        chosen("preflight,warp")
    # Shares on an H100 leave the orchestrator room inside the run call's 600 s.
    assert sum(p.seconds for p in PARTS) <= 570
    part = PARTS[0]
    assert timeout_for(part, 1000.0, smoke=False) == part.seconds
    assert timeout_for(part, 12.0, smoke=False) == 12.0  # never past the deadline


def test_a_part_past_its_timeout_is_killed_and_keeps_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "hanging_part.py").write_text(
        "import json, sys, time\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "json.dump({'status': 'running', 'rows': [{'setup': 'first'}]}, open(out, 'w'))\n"
        "time.sleep(120)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with open(tmp_path / "log", "w") as log:
        result = run_part(Part("scale", "hanging_part", 1, 1), tmp_path, tmp_path, 3.0, False, log)
    assert result["status"] == "timed out" and result["exit_code"] is None
    assert result["seconds"] < 30  # killed, not waited for
    assert json.loads((tmp_path / "scale.json").read_text())["rows"] == [{"setup": "first"}]


@pytest.fixture(scope="module")
def lease(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lease-out")
    proc = run_module("benchmarks.gpu_lease", "--smoke", "--out", out,
                      "--work", tmp_path_factory.mktemp("lease-work"), timeout=600,
                      env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "lease:" in proc.stdout.splitlines()[-1]  # the summary is printed last
    return out


def part(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def test_every_part_ends_ok_and_comes_back(lease: Path) -> None:
    summary = json.loads((lease / "lease.json").read_text())
    assert [p["part"] for p in summary["parts"]] == [p.name for p in PARTS]
    assert all(p["status"] == "ok" and p["exit_code"] == 0 for p in summary["parts"])
    # What the device tool brings back: at most 8 plain files, one folder deep.
    files = sorted(f.name for f in lease.iterdir())
    assert len(files) <= 8 and all((lease / f).is_file() for f in files)


def test_preflight_runs_nf4_and_names_the_sdpa_kernels(lease: Path) -> None:
    pre = part(lease, "preflight")
    assert pre["nf4_linear"]["ok"] and pre["nf4_linear"]["packed_dtype"] == "torch.uint8"
    cases = {row["case"]: row for row in pre["sdpa"]}
    assert set(cases) == {"is_causal", "causal_mask", "sliding_window_mask"}
    assert all(row["kernels"] for row in cases.values())
    assert cases["causal_mask"]["rel_diff_vs_is_causal"] < 1e-5
    assert pre["ceilings"]["matmul_tflops"] > 0 and "CPUMonitor" in pre["gpu_metrics"]["collectors"]


def test_scale_trains_bf16_and_nf4_rows_against_the_plan(lease: Path) -> None:
    scale = part(lease, "scale")
    rows = scale["rows"]
    assert not [r for r in rows if "error" in r]
    assert {b["model"] for b in scale["builds"]} == {r["model"] for r in rows}
    assert {r["quantization"] for r in rows} == {"none", "nf4"}
    for row in rows:
        assert row["plan_seconds_p10"] < row["plan_seconds_p50"] < row["plan_seconds_p90"]
        assert row["plan_allocated_p50_gib"] < row["plan_allocated_p90_gib"]
        assert row["last_loss"] < row["first_loss"]  # it trained
    nf4 = {r["setup"]: r for r in rows if r["quantization"] == "nf4"}
    plain = {
        r["setup"]: r
        for r in rows
        if r["quantization"] == "none" and r["model"].startswith("mistral")
    }
    # The same shape: the plan puts a 4-bit base's weights far below the 16-bit ones.
    for label, row in plain.items():
        assert nf4[f"{label} nf4"]["plan_allocated_p50_gib"] < row["plan_allocated_p50_gib"] - 5


def test_study_is_read_back_from_both_stores(lease: Path) -> None:
    study = part(lease, "study")
    assert study["study"]["exit_code"] == 0
    back = study["read_back"]
    assert back["every_trial_in_mlflow"] and back["one_run_per_configuration"]
    assert 3 <= back["child_runs"] <= len(back["trials"])  # continued trials share a run
    assert all(t["state"] == "COMPLETE" or t["state"] == "PRUNED" for t in back["trials"])
    assert all(
        t["estimate_error_pct"] is not None for t in back["trials"] if t["state"] == "COMPLETE"
    )
    assert all("system/cpu_utilization_percentage" in t["system_metrics"] for t in back["trials"])
    assert study["two_workers_one_gpu"]["refused"]
    assert "one trial per GPU" in study["two_workers_one_gpu"]["message"]


def test_levers_compare_at_equal_loss(lease: Path) -> None:
    rows = {r["lever"]: r for r in part(lease, "levers")["rows"]}
    fast = rows["sdpa_fast_path"]
    assert fast["equal_loss"] and fast["loss_rel_difference"] < 1e-5  # the same arithmetic
    assert "needs a CUDA device" in rows["liger"]["error"]  # Triton: the lease measures it
    # Unpacked samples of many lengths: trained, and the plan's share for them beside it.
    varied = rows["expandable_segments"]
    assert "error" not in varied, varied
    assert varied["default"]["allocated_gib"] > 0 and varied["default"]["last_loss"] > 0
    vary, whole = varied["plan_lengths_vary"], varied["plan_whole_rows"]
    assert vary["parts_gib"]["varied_length_reserve"] > 0 == whole["parts_gib"]["varied_length_reserve"]
    assert vary["reserved_p50_gib"] > whole["reserved_p50_gib"]


def test_time_model_part_calibrates_and_keeps_its_raw_runs(lease: Path) -> None:
    model = part(lease, "time_model")
    assert model["probe_runs"] >= 3 and model["rows"]
    assert (lease / model["raw"]).is_file()


def test_without_cuda_a_part_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = run_module("benchmarks.lease.preflight", "--out", tmp_path / "p.json",
                      "--work", tmp_path, timeout=120)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line and "Warning" not in line]
    assert proc.returncode == 2 and len(errors) == 1 and "no CUDA device" in errors[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--deadline-seconds", "-5"], "--deadline-seconds must be > 0"),
        (["--deadline-seconds", "nan"], "--deadline-seconds must be > 0"),
        (["--out", "{file}/out"], "--out: cannot create"),
        (["--work", "{file}/work"], "--work: cannot create"),
        (["--predict", "{file}/p.json"], "cannot create"),
        (["--predict", "{tmp}"], "it is a folder"),
    ],
)
def test_bad_lease_input_exits_2_with_one_line_before_any_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    from benchmarks.gpu_lease import main
    from common.cli import run_cli

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    out = tmp_path / "out"
    argv = [a.format(file=a_file, tmp=tmp_path) for a in args]
    argv = argv if "--out" in argv else ["--out", str(out), *argv]
    assert run_cli(main, ["--smoke", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not out.exists()  # no part ran, nothing was written


def _as_a_gpu_lease(lease: Path, to: Path) -> Path:
    """The smoke's files as a GPU lease wrote them: not smoke, and reserved peaks (the CPU has
    no caching allocator, so its reserved peaks are 0: the allocated ones stand in)."""
    shutil.copytree(lease, to)
    record = json.loads((to / "lease.json").read_text())
    (to / "lease.json").write_text(json.dumps({**record, "smoke": False}))
    scale = json.loads((to / "scale.json").read_text())
    for row in scale["rows"]:
        row["reserved_gib"] = row.get("allocated_gib", 0.0)
    (to / "scale.json").write_text(json.dumps(scale))
    return to


def test_ingest_keeps_the_files_and_adds_the_scale_rows_to_the_fit(
    lease: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.priors.fit import replay_with
    from analysis.priors.fitted import load
    from analysis.priors.published_runs import measured_runs
    from benchmarks.lease.ingest import FITTED_MODEL, main
    from common.cli import run_cli

    out = _as_a_gpu_lease(lease, tmp_path / "out")
    flags = ["--measurements", str(tmp_path / "docs"), "--into", str(tmp_path / "measured")]
    # A smoke lease measured no GPU: refused, nothing written.
    assert run_cli(main, [str(lease), *flags]) == 2
    assert "--smoke" in capsys.readouterr().err and not (tmp_path / "docs").exists()

    assert run_cli(main, [str(out), *flags]) == 0
    date = json.loads((lease / "lease.json").read_text())["date"]
    kept = tmp_path / "docs" / f"gpu-lease-h100-{date}"
    assert {p.name for p in lease.iterdir()} | {"ingest.json"} == {p.name for p in kept.iterdir()}
    scale = json.loads((out / "scale.json").read_text())
    trained = [r for r in scale["rows"] if "error" not in r]
    runs = measured_runs(tmp_path / "measured")
    assert [r.name for r in runs] == [f"lease {r['model']} {r['setup']}, H100" for r in trained]
    for run, row in zip(runs, trained, strict=True):
        assert run.seconds_per_step == row["seconds_per_step"]
        assert run.memory_gib == row["reserved_gib"] and run.memory_measure == "reserved"
        assert run.quantization == row["quantization"] and run.max_length == row["max_length"]
        assert run.held_out == (row["model"] != FITTED_MODEL or row["quantization"] == "nf4")
    assert any(not r.held_out for r in runs) and any(r.held_out for r in runs)
    priors, cache = load(), {}
    assert priors is not None
    for run in runs:  # the plan replays each as it replays a published row
        assert replay_with(run, priors, cache).seconds_p50 > 0

    report = json.loads((kept / "ingest.json").read_text())
    step = {(r["setup"].removesuffix(" nf4"), r["quantization"]): r["seconds_per_step"]
            for r in trained if r["model"] == FITTED_MODEL}  # fmt: skip
    ratios = [step[s, "nf4"] / step[s, "none"] for s, q in step if q == "nf4"]
    assert ratios and report["nf4"]["step_factor"] == pytest.approx(statistics.median(ratios))
    measured = {r["lever"]: r for r in json.loads((out / "levers.json").read_text())["rows"]
                if "speedup" in r}  # fmt: skip
    assert {f["lever"] for f in report["levers"]} == set(measured)
    for found in report["levers"]:
        assert found["step_factor"] == pytest.approx(1 / measured[found["lever"]]["speedup"])
    assert report["varied_length"]["share_fitted"] > 0
    # The time model's raw runs, kept, are what the offline refit reads.
    from benchmarks.time_model_refit import main as refit

    assert run_cli(refit, [report["time_model_raw"], "--json", str(tmp_path / "refit.json")]) == 0
    assert json.loads((tmp_path / "refit.json").read_text())["rows"]

    # Once ingested, the same lease again is refused (the group would be written twice).
    before = (tmp_path / "measured").joinpath(f"lease-h100-{date}.json").read_text()
    assert run_cli(main, [str(out), *flags]) == 2
    assert "ingested already" in capsys.readouterr().err
    assert (tmp_path / "measured").joinpath(f"lease-h100-{date}.json").read_text() == before


def test_the_summary_shows_the_varied_length_row_whether_or_not_expandable_ran(
    lease: Path,
) -> None:
    from benchmarks.gpu_lease import headline

    levers = part(lease, "levers")
    (row,) = [r for r in levers["rows"] if r.get("lever") == "expandable_segments"]
    plan = f"plan p50 {row['plan_lengths_vary']['reserved_p50_gib']:.1f}"
    assert "expandable not on the CPU" in headline("levers", levers) and plan in headline("levers", levers)
    row["expandable"] = {"reserved_gib": 3.25, "tokens_per_second": 1.0}
    assert "expandable 3.2" in headline("levers", levers)
    row["expandable"] = "failed: RuntimeError: no virtual memory API"  # kept beside the default
    assert "expandable failed: RuntimeError" in headline("levers", levers)


def test_a_study_that_failed_on_the_device_is_a_failed_part_in_the_summary(lease: Path) -> None:
    # The part runs to its end either way (its JSON complete, the refusal checked), but a study
    # that exited 1 used to read "ok" with "states None" beside it.
    from benchmarks.gpu_lease import headline
    from benchmarks.lease.study import study_status

    study = part(lease, "study")
    assert study_status(study["study"], study["read_back"]) == "ok" == study["status"]
    assert headline("study", study).startswith("states {")
    failed = copy.deepcopy(study)
    failed["study"] = {"exit_code": 1, "stdout_tail": "",
                       "stderr_tail": "Traceback ...\nModuleNotFoundError: No module named 'x'\n"}  # fmt: skip
    failed["read_back"] = {"error": "FileNotFoundError: summary.json"}
    assert study_status(failed["study"], None) == "study exit 1"
    assert headline("study", failed) == "study exit 1: ModuleNotFoundError: No module named 'x'"
    assert study_status({"error": "the study ran past 90 s"}, None) == "study timed out"
    assert headline("study", {"study": {"error": "the study ran past 90 s"}}) == (
        "the study ran past 90 s"
    )
    assert study_status(study["study"], None) == "read-back failed"
    failed["study"] = study["study"]
    assert headline("study", failed) == "read-back: FileNotFoundError: summary.json"


def test_scale_starts_no_setup_it_could_not_finish(tmp_path: Path) -> None:
    from benchmarks.lease.scale import SETUPS, SMOKE_SETUPS, expected_seconds

    # 5 s cannot hold a setup's set-up and its base: every one is skipped, none is built.
    out = tmp_path / "scale.json"
    proc = run_module("benchmarks.lease.scale", "--smoke", "--out", out, "--work", tmp_path,
                      "--budget-seconds", "5", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["status"] == "ok" and "rows" not in record
    assert len(record["skipped"]) == sum(len(s) for s in SMOKE_SETUPS.values())
    assert not (tmp_path / "models").exists()
    # On an H100 a 7B setup that loads a base needs that base's seconds beyond one that does not.
    from analysis.priors.fitted import load

    priors, cache = load(), {}
    setup = SETUPS["mistral-7b-v0.1"][0]
    kept = expected_seconds("mistral-7b-v0.1", "H100", setup, priors, cache,
                            new_base=False, build=False)  # fmt: skip
    loads = expected_seconds("mistral-7b-v0.1", "H100", setup, priors, cache,
                             new_base=True, build=True)  # fmt: skip
    assert loads - kept == pytest.approx(2 * (3.0 + 2.5 * 7.24))
    assert kept > 6 * 1.0  # six steps of 2 x 2,048 tokens of a 7B model: over a second each


def test_time_model_sizes_held_out_runs_to_what_is_left() -> None:
    from benchmarks.lease.time_model import OVERRUN, held_out_seconds

    assert held_out_seconds(1000.0, 20.0, 8.0, 5.0) == 100.0  # room: 5 x the longest probe
    assert held_out_seconds(60.0, 20.0, 8.0, 5.0) == pytest.approx(60.0 / OVERRUN)
    assert held_out_seconds(20.0, 20.0, 8.0, 5.0) is None  # under 2 typical probes
    # Probes quicker than the run wanted (the CPU smoke's): it needs only its own length.
    assert held_out_seconds(30.0, 1.0, 0.9, 1.5) == 1.5


def test_memory_freed_between_trials_compares_starts_on_one_base() -> None:
    from benchmarks.lease.study import FREED_SLACK_MB, freed

    def trial(quantization: str, mb: float) -> dict:
        return {"quantization": quantization, "start_memory_mb": mb}

    assert freed([trial("none", 0.0)]) is None  # nothing trained
    assert freed([trial("none", 600.0), trial("none", 640.0), trial("nf4", 300.0)])
    # A 4-bit base starts lower than the 16-bit one, and is judged against its own first.
    assert freed([trial("nf4", 300.0), trial("none", 600.0), trial("none", 610.0)])
    assert not freed([trial("none", 600.0), trial("none", 0.0),
                      trial("none", 600.0 + 2 * FREED_SLACK_MB)])  # fmt: skip
