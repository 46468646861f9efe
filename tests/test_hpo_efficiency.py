"""The search-efficiency benchmark's arithmetic: picks over time, the time to the peer's best,
the compute spent on configurations that cannot fit, the window's share of the space."""

import pytest

from benchmarks._search_curves import (
    TrialRecord,
    infeasible_share,
    mean_and_spread,
    median_or_none,
    pick_loss_curve,
    picks_over_time,
    share_beyond,
    time_ratio,
    time_to_reach,
    window_for_share,
)


def test_the_pick_changes_only_when_a_better_trial_finishes() -> None:
    trials = [
        TrialRecord(0, 0, 10, 2.0),
        TrialRecord(1, 10, 20, 2.5),  # worse: the pick stays
        TrialRecord(2, 20, 30, None),  # pruned: no score
        TrialRecord(3, 30, 40, 1.5),
        TrialRecord(4, 40, 50, 1.5),  # a tie: the lower number stays
    ]
    assert picks_over_time(trials) == [(10, 0), (40, 3)]


def test_trials_are_taken_in_the_order_they_finished() -> None:
    # Trial 1 started later but finished first.
    trials = [TrialRecord(0, 0, 30, 1.0), TrialRecord(1, 5, 20, 2.0)]
    assert picks_over_time(trials) == [(20, 1), (30, 0)]


def test_a_fitting_trial_is_preferred_while_one_exists() -> None:
    trials = [
        TrialRecord(0, 0, 10, 3.0, fits=False),  # the only one: picked all the same
        TrialRecord(1, 10, 20, 2.0),
        TrialRecord(2, 20, 30, 1.0, fits=False),  # better, but predicted not to fit
    ]
    assert picks_over_time(trials) == [(10, 0), (20, 1)]


def test_time_to_the_peer_best_follows_the_picks_full_run_losses() -> None:
    changes = [(10.0, 0), (40.0, 3), (70.0, 5)]
    # The pick's full run can get worse when the search's own score improved.
    curve = pick_loss_curve(changes, {0: 2.0, 3: 1.2, 5: 1.4})
    assert curve == [(10.0, 2.0), (40.0, 1.2), (70.0, 1.4)]
    assert time_to_reach(curve, 1.3) == 40.0
    assert time_to_reach(curve, 2.0) == 10.0
    assert time_to_reach(curve, 1.0) is None
    assert time_ratio(40.0, 120.0) == pytest.approx(1 / 3)
    assert time_ratio(None, 120.0) is None


def test_infeasible_share_weighs_trials_by_their_seconds() -> None:
    trials = [
        TrialRecord(0, 0, 30, 1.0, infeasible=True),
        TrialRecord(1, 30, 40, 1.0),
        TrialRecord(2, 40, 40.5, None, infeasible=True, trained=False),  # refused: 0.5 s
        TrialRecord(3, 41, 100.5, 2.0),
    ]
    assert infeasible_share(trials) == pytest.approx(30.5 / 100)
    # The refusal's half second is bookkeeping, not training: only the 30 s trial counts.
    assert infeasible_share(trials, trained_only=True) == pytest.approx(30 / 100)
    assert infeasible_share([]) == 0.0


def test_the_window_leaves_the_asked_share_beyond_it() -> None:
    durations = [float(d) for d in range(1, 81)]  # 80 configurations, as the default space
    window = window_for_share(durations, 0.5)
    assert window == 40.0
    assert share_beyond(durations, window) == 0.5
    assert share_beyond(durations, window_for_share(durations, 0.25)) == 0.25
    with pytest.raises(ValueError, match="share"):
        window_for_share(durations, 1.0)


def test_mean_spread_and_a_median_where_never_counts_as_last() -> None:
    assert mean_and_spread([1.0, 2.0, 3.0]) == {
        "mean": 2.0,
        "sd": 1.0,
        "min": 1.0,
        "max": 3.0,
        "n": 3,
    }
    assert mean_and_spread([])["mean"] is None
    assert median_or_none([0.2, None, 0.4]) == 0.4
    assert median_or_none([0.2, None, None]) is None
    assert median_or_none([0.2, 0.4]) == pytest.approx(0.3)
