"""benchmarks/curve_replay.py: recorded curves through the study's own decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.curve_replay import (
    DEFAULT_CURVES,
    Replay,
    Strategy,
    draws,
    load_curves,
    load_tiny_set,
    main,
)
from benchmarks.curve_replay import row as replay_row
from hpo.keys import PROMOTED_FROM_ATTR
from hpo.pick import rung_of

REPO = Path(__file__).resolve().parent.parent


def test_the_smoke_replays_every_strategy_and_writes_its_rows(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    assert main(["--smoke", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    rows = {r["strategy"]: r for r in payload["rows"]}
    assert "reference run" in payload["not_replayed"]
    default = rows["default"]
    assert default["fraction"] is None and default["rungs"] == ["6@0.12", "2@0.44"]
    # Studies of 6 at 0.02 of 750 steps (15 steps, one evaluation), 5 on to 90 (a rung
    # leaves one behind at least) and 2 to 330 steps: each trial is charged the steps it
    # adds, as a rung continues its checkpoint.
    assert default["search_cost_full_runs"] == pytest.approx((6 * 15 + 5 * 75 + 2 * 240) / 750)
    single = rows["0.1 of the run"]
    assert single["fraction"] == 0.1 and single["rungs"] == []
    # The default planned into smaller budgets, as the study plans it: the same rungs'
    # trials at shorter shares, or none where even those do not fit.
    for budget in (0.5, 0.75, 1.0):
        scaled = rows[f"default within {budget:g} full runs"]
        keeps = [int(r.split("@")[0]) for r in scaled["rungs"]]
        assert keeps in ([6, 2], [])
        shares = [float(r.split("@")[1]) for r in scaled["rungs"]]
        assert all(s <= d for s, d in zip(shares, (0.12, 0.44), strict=False))
    for row in payload["rows"]:
        assert row["studies"] == 2 and row["study_size"] == 6
        assert 0 <= row["pick_in_best_two"] <= 1 and row["regret"] >= 0
        assert 0 <= row["regret_share_of_range"] <= 1
        assert 0 <= row["band_coverage"] <= 1 and row["median_abs_pct_error"] >= 0
        rungs = row["by_rung"]
        assert "0" in rungs and all(0 <= r["band_coverage"] <= 1 for r in rungs.values())
        assert sum(r["predictions"] for r in rungs.values()) >= row["studies"]


def test_a_replayed_study_promotes_picks_and_predicts_as_the_study_does() -> None:
    pool = load_curves(DEFAULT_CURVES)
    assert len(pool.runs) == 200 and pool.runs[0].total_steps == 750
    draw = list(range(8))
    replay = Replay(pool, draw, Strategy.default())
    outcome = replay.run()
    trials = replay.study.get_trials(deepcopy=False)
    assert [rung_of(t) for t in trials] == [0] * 8 + [1] * 6 + [2] * 2
    # Rung 1 took the 6 lowest losses at 15 steps; the study picked from rung 2.
    at_15 = sorted(draw, key=lambda i: pool.runs[i].losses[0])[:6]
    assert sorted(t.user_attrs["replay_run"] for t in trials[8:14]) == sorted(at_15)
    assert all(trials[t.user_attrs[PROMOTED_FROM_ATTR]].number < t.number for t in trials[8:])
    finals = sorted(pool.runs[i].final for i in draw)
    assert outcome.picked in {pool.runs[t.user_attrs["replay_run"]].final for t in trials[14:]}
    assert finals[0] <= outcome.picked <= finals[-1]
    assert len(outcome.errors) == 8 and all(abs(e) < 0.2 for e in outcome.errors)


def test_recorded_tiny_model_sets_are_read_as_pools() -> None:
    sets = sorted((REPO / "docs" / "measurements").glob("rank-fidelity-*.json"))
    pools = [p for path in sets if (p := load_tiny_set(path)) is not None]
    assert len(pools) >= 8
    for pool in pools:
        for run in pool.runs:
            assert list(run.steps) == sorted(set(run.steps)) and run.steps[-1] <= run.total_steps
            assert len(run.losses) == len(run.steps) and run.final > 0


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--curves", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["--study-size", "1"]) == 2


def test_the_picks_band_holds_a_run_that_ended_above_its_last_rungs_loss() -> None:
    """Run 56 of the recorded real runs, among the best, ended at 2.1647 above the 2.1633 it
    measured at the last rung (0.44 of the run): the evaluations' noise (about 0.1 %), not
    a rise. A p90 capped at the bare last loss (or at the p50 above it) left it out; the
    ceiling allows the noise of two evaluations."""
    pool = load_curves(DEFAULT_CURVES)
    order = sorted(range(len(pool.runs)), key=lambda i: pool.runs[i].final)
    draw = sorted([56, *order[120:200:11][:7]])  # with seven that end higher
    outcome = Replay(pool, draw, Strategy.default()).run()
    assert outcome.picked == pool.runs[56].final
    assert outcome.picked_band is not None
    error, inside, upper, _ = outcome.picked_band
    assert inside and upper > 0 and abs(error) < 0.005


def test_the_first_rungs_predictions_hold_their_outcomes() -> None:
    """Half a study's end predictions are of trials stopped at their one evaluation, inside
    the warmup. Before, those whose point sat at the starting loss were predicted where the
    run started, 7-9 % above outcomes that ended with the others' (one to three in each of
    these studies). Now each lies within 3 % of its outcome, and the band holds 3 in 4.

    Its band's error per unit of distance is what the study's backtest measured with each
    curve cut to one point (as few as the trial has) and predicted with the other curves
    whole, over about the trial's distance: the half cut's, carried in proportion over the
    4.4 units from the first evaluation to the end, made these bands 2.64 % wide at the
    median, about 6x their errors; every curve cut to one point at once, 2.10 % (2.41 %
    once each configuration was fitted once); cross-fitted, 1.21 %."""
    pool = load_curves(DEFAULT_CURVES)
    outcomes = [Replay(pool, d, Strategy.default()).run() for d in draws(pool, 12, 3, 0)]
    first = [(o, i) for o in outcomes for i, rung in enumerate(o.rungs) if rung == 0]
    assert len(first) == 18  # of each study's 12 first-rung trials, 6 go on
    assert max(o.errors[i] for o, i in first) < 0.03
    by_rung = replay_row(Strategy.default(), outcomes, 12)["by_rung"]["0"]
    assert by_rung["band_coverage"] >= 0.75
    assert by_rung["median_band_halfwidth_pct"] < 1.8
