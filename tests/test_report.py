"""`python -m analysis.report`: a real SQLite study in, PNGs and a report.md out.

The study comes from `tests.report_study`: real Optuna trials with the user attributes a
study records, added without training anything.
"""

from __future__ import annotations

import math
import struct
import subprocess
from pathlib import Path

import numpy as np
import optuna
import pytest

from analysis.report import (
    REPORT_MD,
    cheapest_within,
    pareto_front,
    read_full_runs,
    trial_rows,
    write_report,
)
from analysis.report.__main__ import main
from analysis.report.canvas import HEIGHT_PX, WIDTH_PX
from analysis.report.machine_plots import DURATIONS, duration_ticks, durations, trial_times
from analysis.report.rows import TrialRow
from common.cli import run_cli
from common.errors import BadInputError
from common.files import write_json
from tests.cli import run_module
from tests.report_study import LAYOUT, build_study


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite file holding every study the tests read."""
    db = tmp_path_factory.mktemp("report") / "optuna.db"
    url = f"sqlite:///{db}"
    build_study(url, "full")
    build_study(url, "bare", rich=False, layout=["complete"] * 4 + ["pruned"])
    build_study(url, "none-complete", layout=["never_trained", "pruned", "failed"])
    return url


# ----------------------------------------------------------------------------- pure data


FRONT = [(2.00, 5.0, "a"), (2.10, 2.0, "b"), (2.30, 1.0, "c")]
DOMINATED = [(2.20, 3.0, "d"), (2.40, 6.0, "e"), (2.30, 1.5, "f")]


def test_pareto_front_keeps_the_non_dominated_points_cheapest_first() -> None:
    assert pareto_front(DOMINATED + FRONT) == sorted(FRONT, key=lambda p: p[1])
    assert pareto_front([]) == []


def test_pareto_front_keeps_one_of_equal_points_and_ignores_non_finite() -> None:
    points = [(2.0, 1.0, "x"), (2.0, 1.0, "y"), (math.nan, 0.5, "n"), (1.0, math.inf, "i")]
    assert pareto_front(points) == [(2.0, 1.0, "x")]
    # Equal cost: only the lower loss; equal loss: only the cheaper.
    assert pareto_front([(2.0, 1.0, 1), (1.9, 1.0, 2), (1.9, 3.0, 3)]) == [(1.9, 1.0, 2)]


@pytest.mark.parametrize(
    ("pct", "expected"),
    [(0.0, "a"), (4.9, "a"), (5.0, "b"), (10.0, "b"), (15.0, "c"), (100.0, "c")],
)
def test_cheapest_within_takes_the_cheapest_point_near_the_best_loss(
    pct: float, expected: str
) -> None:
    found = cheapest_within(FRONT + DOMINATED, pct)
    assert found is not None and found[2] == expected


def test_cheapest_within_breaks_cost_ties_by_loss_and_checks_pct() -> None:
    assert cheapest_within([(2.01, 1.0, "worse"), (2.0, 1.0, "better")], 1.0) == (
        2.0,
        1.0,
        "better",
    )
    assert cheapest_within([], 1.0) is None
    assert cheapest_within([(math.nan, 1.0, "n")], 1.0) is None
    with pytest.raises(ValueError, match="pct"):
        cheapest_within(FRONT, -1.0)


def test_trial_rows_tell_never_trained_from_pruned(storage: str) -> None:
    study = optuna.load_study(study_name="full", storage=storage)
    rows = {row.number: row for row in trial_rows(study.trials)}
    states = [rows[n].state for n in sorted(rows)]
    assert states == LAYOUT
    never = [row for row in rows.values() if row.state == "never_trained"]
    assert {bool(row.attrs.get("never_trained")) for row in never} == {True, False}  # both rules
    assert rows[4].last_intermediate is not None and rows[4].value is None
    assert rows[0].predicted_loss == tuple(rows[0].attrs["predicted_final_loss"][k]
                                           for k in ("p10", "p50", "p90"))  # fmt: skip
    assert rows[0].estimate("duration_hours", "p50") is not None
    assert rows[0].estimate("no", "such") is None


def test_the_front_compares_the_studys_end_refit_where_it_has_one() -> None:
    recorded = {"predicted_final_loss": {"p10": 1.0, "p50": 2.0, "p90": 3.0}}
    row = TrialRow(0, "complete", 2.5, None, None, None, attrs=recorded)
    assert row.loss_for_front == 2.0  # as the trial recorded it
    refit = TrialRow(0, "complete", 2.5, None, None, None, attrs=recorded, end_band={"p50": 1.4})
    assert refit.loss_for_front == 1.4
    assert refit.predicted_loss == (1.0, 2.0, 3.0)  # the trial's own record is unchanged
    assert TrialRow(0, "complete", 2.5, None, None, None).loss_for_front == 2.5  # its value


def _timed_row(number: int, state: str, **attrs: float) -> TrialRow:
    return TrialRow(number, state, None, None, None, None, attrs=attrs)


def _band(predicted: float) -> dict[str, float]:
    return {
        "predicted_trial_seconds": predicted,
        "predicted_trial_seconds_p10": predicted * 0.8,
        "predicted_trial_seconds_p90": predicted * 1.25,
    }


# Sub-second trials, as a tiny model's are: a complete one, a pruned one predicted for the
# steps it ran, one pruned but predicted for its whole trial, one never trained.
TIMED_ROWS = [
    _timed_row(
        0,
        "complete",
        **_band(0.4),
        measured_trial_seconds=0.42,
        predicted_trial_steps=10,
        trained_steps=10,
        predicted_trial_train_seconds=0.3,
        steps_seconds=0.33,
    ),
    _timed_row(
        1,
        "pruned",
        **_band(0.12),
        measured_trial_seconds=0.11,
        predicted_trial_steps=3,
        trained_steps=3,
    ),
    _timed_row(
        2,
        "pruned",
        **_band(0.4),
        measured_trial_seconds=0.13,
        predicted_trial_steps=10,
        trained_steps=3,
    ),
    _timed_row(3, "never_trained", **_band(9.0)),
]


def test_durations_compare_each_trial_with_the_prediction_for_the_steps_it_trained(
    tmp_path: Path,
) -> None:
    times = trial_times(TIMED_ROWS)
    assert [t.measured for t in times.complete] == [0.42]
    assert [t.measured for t in times.pruned] == [0.11]  # the steps it ran, not a whole trial
    assert times.left_out == 1
    assert times.steps_only == [(0.33, 0.3)]
    section = durations(TIMED_ROWS, tmp_path)
    assert section.image == DURATIONS and (tmp_path / DURATIONS).is_file()
    assert "1 trained all their steps, 1 was pruned" in section.reading
    assert "1 left out" in section.reading
    assert "2 of 2 took a time inside the predicted p10-p90 band" in section.reading
    assert "On the optimizer steps alone" in section.reading


def test_duration_axes_label_ticks_below_one_second(tmp_path: Path) -> None:
    from analysis.report.canvas import new_figure, save

    fig, (ax,) = new_figure()
    ax.plot([0.004, 0.8], [0.004, 0.8])
    ax.set(xscale="log", yscale="log", xlim=(0.004, 0.8), ylim=(0.004, 0.8))
    duration_ticks(ax)
    fig.canvas.draw()
    for axis in (ax.xaxis, ax.yaxis):
        low, high = axis.get_view_interval()
        labels = [
            tick.label1.get_text()
            for tick in axis.get_major_ticks()
            if low <= tick.get_loc() <= high
        ]
        assert len(labels) >= 4 and len(set(labels)) == len(labels), labels
        assert all(label.endswith(" ms") for label in labels), labels
    save(fig, tmp_path / "ticks.png")


def test_read_full_runs_takes_what_is_there(tmp_path: Path) -> None:
    full = write_json(tmp_path / "a.json", {"wall_seconds": 100.0, "cumulative_wall_seconds": 250.0,
                                            "predicted_seconds_p10": 200.0,
                                            "predicted_seconds": 230.0})  # fmt: skip
    bare = write_json(tmp_path / "b.json", {"wall_seconds": 50.0})
    first, second = read_full_runs([full, bare])
    assert (first.seconds, first.predicted) == (250.0, (200.0, 230.0, None))
    assert (second.seconds, second.predicted) == (50.0, (None, None, None))
    with pytest.raises(BadInputError, match="wall_seconds"):
        read_full_runs([write_json(tmp_path / "c.json", {"status": "finished"})])
    with pytest.raises(BadInputError, match="not found"):
        read_full_runs([tmp_path / "missing.json"])


# ----------------------------------------------------------------------------- the report


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_write_report_skips_what_a_bare_study_lacks_and_replaces_the_old_report(
    storage: str, tmp_path: Path
) -> None:
    study = optuna.load_study(study_name="bare", storage=storage)
    out = tmp_path / "report"
    out.mkdir()
    (out / "stale.png").write_bytes(b"old")
    report = write_report(study, out)
    assert report.folder == out.absolute()
    assert not (out / "stale.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no staging left behind
    assert [p.name for p in report.images] == ["history.png", "importances.png", "slice.png"]
    text = report.markdown.read_text(encoding="utf-8")
    assert "_Skipped: no complete trial records its validation curve" in text
    assert len(report.skipped) == 5 and "Pareto" in report.skipped[-1]
    assert all(png_size(p) == (WIDTH_PX, HEIGHT_PX) for p in report.images)


@pytest.fixture(scope="module")
def cli_report(storage: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full study's report, written by the real command line with two full runs."""
    tmp = tmp_path_factory.mktemp("cli")
    runs = [
        write_json(tmp / "run1.json", {"wall_seconds": 7000.0, "predicted_seconds": 6400.0,
                                       "predicted_seconds_p10": 5600.0,
                                       "predicted_seconds_p90": 7600.0}),
        write_json(tmp / "run2.json", {"wall_seconds": 3000.0}),
    ]  # fmt: skip
    out = tmp / "report"
    proc = run_module("analysis.report", "--study-name", "full", "--storage", storage,
                      "--out", str(out), "--tracking-uri", "http://127.0.0.1:5000",
                      *(a for run in runs for a in ("--full-run", str(run))), timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "report:" in proc.stdout and proc.stderr.count("Traceback") == 0
    return out


EXPECTED_IMAGES = [
    "history.png", "importances.png", "slice.png", "curves.png",
    "durations.png", "throughput.png", "memory.png", "pareto.png",
]  # fmt: skip


def test_cli_writes_every_plot_and_a_report_that_embeds_them(cli_report: Path) -> None:
    text = (cli_report / REPORT_MD).read_text(encoding="utf-8")
    assert sorted(p.name for p in cli_report.glob("*.png")) == sorted(EXPECTED_IMAGES)
    for name in EXPECTED_IMAGES:
        png = cli_report / name
        assert png.stat().st_size > 5000, name
        assert png_size(png) == (WIDTH_PX, HEIGHT_PX), name
        assert f"]({name})" in text
        # One line of reading right under each image.
        after = text.split(f"]({name})", 1)[1].lstrip("\n").splitlines()[0]
        assert after.endswith(".") and len(after) > 30, (name, after)
    assert "Skipped" not in text
    assert "Best value" in text and "of 13" in text and "2 never trained" in text
    assert "exported trial 1" in text
    assert "a full run took 1.9 h against 1.8 h predicted" in text
    assert "1 full run(s) without a prediction" in text
    assert "http://127.0.0.1:5000/#/experiments/1/runs/0123abcd" in text


def test_cli_refuses_a_study_without_complete_trials_with_one_line(
    storage: str, tmp_path: Path
) -> None:
    proc = run_module("analysis.report", "--study-name", "none-complete", "--storage", storage,
                      "--out", str(tmp_path / "out"), timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: study 'none-complete' has no complete trial to report on "
        "(1 pruned, 1 failed, 1 never trained)"
    ]
    assert list(tmp_path.iterdir()) == [], "nothing may be written"


@pytest.mark.parametrize(
    ("study", "url", "message"),
    [
        ("nope", None, "no study named 'nope'"),
        ("full", "sqlite:///{tmp}/nothing.db", "no such database file"),
        ("full", "postgresql+psycopg://hpo:s3cret@127.0.0.1:1/optuna", "cannot open storage"),
    ],
)
def test_cli_refuses_a_missing_study_or_storage_with_one_line(
    storage: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    study: str,
    url: str | None,
    message: str,
) -> None:
    url = storage if url is None else url.format(tmp=tmp_path)
    argv = ["--study-name", study, "--storage", url, "--out", str(tmp_path / "out")]
    assert run_cli(main, argv) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "s3cret" not in out + err
    assert list(tmp_path.iterdir()) == [], "nothing may be written (no empty database either)"


# ----------------------------------------------------------------------------- rendered


def markdown_to_html(text: str) -> str:
    """The little Markdown report.md uses: headings, images, links, code, italic paragraphs."""
    import html
    import re

    def inline(line: str) -> str:
        line = html.escape(line, quote=False)
        line = re.sub(r"`([^`]*)`", r"<code>\1</code>", line)
        return re.sub(r"\[([^\]]*)\]\(([^)]*)\)", r'<a href="\2">\1</a>', line)

    body = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if image := re.fullmatch(r"!\[([^\]]*)\]\(([^)]*)\)", line):
            alt, src = (html.escape(g) for g in image.groups())
            body.append(f'<p><img src="{src}" alt="{alt}" width="800" height="500"></p>')
        elif heading := re.fullmatch(r"(#{1,6}) (.*)", line):
            level = len(heading.group(1))
            body.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
        elif line.startswith("_") and line.endswith("_"):
            body.append(f"<p><em>{inline(line[1:-1])}</em></p>")
        else:
            body.append(f"<p>{inline(line)}</p>")
    return '<!doctype html><html><head><meta charset="utf-8"></head><body>' + "\n".join(body)


def test_report_renders_in_headless_chromium(cli_report: Path, tmp_path: Path) -> None:
    import shutil

    from matplotlib.image import imread

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed: run `bash scripts/ensure-chromium.sh`"
    page = cli_report / "report.html"
    page.write_text(markdown_to_html((cli_report / REPORT_MD).read_text(encoding="utf-8")))
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot}", "--window-size=900,1400", page.as_uri()],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (1400, 900)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 1, "the screenshot is blank"
    # The history plot's dots are matplotlib's tab:blue: seen only when the image loaded.
    blue = np.all(np.abs(pixels - np.array([0.122, 0.467, 0.706])) < 0.03, axis=-1)
    assert blue.sum() > 200, "the report's first image did not render"


def test_a_full_runs_own_report_gives_its_band(tmp_path: Path) -> None:
    # What `python -m trainers.train --json` writes: the preset's estimate, in hours.
    estimate = {"duration_hours": {"p10": 0.5, "p50": 0.6, "p90": 0.75}}
    report = write_json(tmp_path / "r.json", {"wall_seconds": 2000.0, "estimate": estimate})
    (run,) = read_full_runs([report])
    assert run.predicted == (1800.0, 2160.0, 2700.0)


def test_the_report_lists_the_full_runs_that_reported_back() -> None:
    from analysis.calibration.full_runs import MEASURED_PREFIX
    from analysis.report.document import measured_line

    assert measured_line({"other": 1}) is None
    attrs = {
        MEASURED_PREFIX + "b": {"trial": 5, "loss": 2.25, "added_at": 2.0},
        MEASURED_PREFIX + "a": {"trial": 3, "loss": 1.9, "added_at": 1.0},
        MEASURED_PREFIX + "bad": {"trial": "x", "loss": None},  # edited by hand: left out
    }
    assert measured_line(attrs) == (
        "Full runs reported back, final validation loss measured: trial 3: 1.9000 (MLflow run "
        "a); trial 5: 2.2500 (MLflow run b)."
    )
    attrs[MEASURED_PREFIX + "c"] = {"trial": 7, "loss": 2.0, "added_at": 3.0, "best_step": 40}
    assert measured_line(attrs).endswith(
        "; trial 7: 2.0000 (MLflow run c, stopped early, its best at step 40)."
    )
