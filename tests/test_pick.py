"""Which trial a study exports: the best, one by number, or the cheapest nearly as good."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from common.cli import run_cli
from common.errors import BadInputError
from hpo.export import main as export_main
from hpo.full_run_reports import MeasuredRun, record
from hpo.keys import PROMOTED_FROM_ATTR
from hpo.pick import measured_standing, pick_trial, standing_trials

# (predicted loss, hours, cost, fits the window)
TRIALS = [
    (2.00, 9.0, 22.5, True),  # the best loss
    (2.01, 4.0, 10.0, True),  # 0.5 % worse, less than half the time: cheapest within 1 %
    (2.03, 2.0, 5.0, True),  # 1.5 % worse
    (1.90, 20.0, 50.0, False),  # better, but does not fit the window
]


def _study(price: float = 2.5) -> optuna.Study:
    study = optuna.create_study()
    for loss, hours, cost, fits in TRIALS:
        study.add_trial(
            optuna.trial.create_trial(
                value=loss,
                user_attrs={
                    "predicted_final_loss": {"p10": loss - 0.1, "p50": loss, "p90": loss + 0.1},
                    "estimate": {
                        "duration_hours": {"p50": hours},
                        "cost": {"p50": cost * price / 2.5},
                        "price_per_hour": price,
                        "fits_window": fits,
                    },
                },
            )
        )
    return study


def test_best_is_the_lowest_score_that_fits() -> None:
    trial, rule = pick_trial(_study())
    assert trial.number == 0 and rule == "best predicted loss"  # trial 3 does not fit


def test_best_of_all_when_nothing_fits() -> None:
    study = optuna.create_study()
    for loss in (2.0, 1.5, 1.8):
        study.add_trial(
            optuna.trial.create_trial(value=loss, user_attrs={"estimate": {"fits_window": False}})
        )
    assert pick_trial(study)[0].number == 1


def _front_study() -> optuna.Study:
    """Loss and hours as two objectives, the predictions in the user attributes as a study
    would leave them."""
    study = optuna.create_study(directions=["minimize", "minimize"])
    for loss, hours, _, fits in TRIALS:
        study.add_trial(
            optuna.trial.create_trial(
                values=[loss, hours],
                user_attrs={
                    "predicted_final_loss": {"p50": loss},
                    "estimate": {"duration_hours": {"p50": hours}, "fits_window": fits},
                },
            )
        )
    return study


def test_a_front_exports_its_best_loss_point_that_fits() -> None:
    trial, rule = pick_trial(_front_study())
    assert trial.number == 0 and rule == "best-loss point of the Pareto front"
    assert pick_trial(_front_study(), within_pct=1.0)[0].number == 1


@pytest.mark.parametrize(("pct", "expected"), [(0.0, 0), (1.0, 1), (2.0, 2), (10.0, 2)])
def test_cheapest_within_picks_the_cheapest_fitting_point(pct: float, expected: int) -> None:
    trial, rule = pick_trial(_study(), within_pct=pct)
    assert trial.number == expected  # never trial 3: it does not fit the window
    assert rule == f"cheapest within {pct:g} % of the best predicted loss"


def test_cheapest_within_compares_the_levels_it_is_given() -> None:
    """`hpo.export` hands it the study's end refits: a trial whose refit is worse than it
    recorded no longer sets the best level (trial 0 at 2.2: the best is trial 1's 2.01, and
    trial 2's 2.03 is within 1 % of it)."""
    assert pick_trial(_study(), within_pct=1.0)[0].number == 1
    assert pick_trial(_study(), within_pct=1.0, losses={0: 2.2})[0].number == 2
    assert pick_trial(_study(), within_pct=1.0, losses={2: 2.5})[0].number == 1


def test_without_a_price_hours_are_the_cost() -> None:
    trial, _ = pick_trial(_study(price=0.0), within_pct=1.0)
    assert trial.number == 1


def test_a_promoted_trial_stands_for_its_first() -> None:
    study = _study()
    study.add_trial(optuna.trial.create_trial(value=1.95, user_attrs={PROMOTED_FROM_ATTR: 1}))
    trial, _ = pick_trial(study)
    assert trial.number == 4  # the best that fits (3 does not); trial 1 is superseded by it
    numbers = {t.number for t in standing_trials(study)}
    assert numbers == {0, 2, 3, 4}


def _ran(study: optuna.Study, trial: int, loss: float, run_id: str = "r") -> None:
    """A full run of `trial`'s preset reported back, as the study's next session keeps it."""
    assert record(study, [MeasuredRun(run_id, trial, loss)]) == 1


def test_a_measured_full_run_stays_the_pick_while_no_prediction_is_below_it() -> None:
    study = _study()
    _ran(study, 0, 2.005)  # the pick's full run: it measured about what was predicted
    trial, rule = pick_trial(study)
    # The best configuration without a full run is trial 1, predicted 2.01: above it.
    assert trial.number == 0
    assert rule == "measured: its full run ended at 2.0050, below trial 1's predicted 2.0100"


def test_a_prediction_below_what_the_pick_measured_is_picked_next() -> None:
    study = _study()
    _ran(study, 0, 2.30)  # the pick's full run ended far above its prediction
    trial, rule = pick_trial(study)
    assert trial.number == 1  # by the study's order, then its level 2.01 < 2.30
    assert rule == (
        "best predicted loss: predicted 2.0100, below the 2.3000 that trial 0's full run measured"
    )
    # Its level is the end refit the caller gives (hpo.summary, hpo.export): refitted above
    # the measured loss, the measured configuration stays.
    assert pick_trial(study, losses={1: 2.4})[0].number == 0
    # Never one that does not fit the window (trial 3, predicted 1.90).
    _ran(study, 1, 2.25, "r1")
    trial, rule = pick_trial(study)
    assert trial.number == 2 and "trial 1's full run measured" in rule
    # Every fitting configuration measured: the lowest measured loss.
    _ran(study, 2, 2.40, "r2")
    trial, rule = pick_trial(study)
    assert trial.number == 1 and rule == "measured: its full run ended at 2.2500"


def test_a_full_run_counts_for_its_configurations_promoted_trial() -> None:
    study = _study()
    study.add_trial(optuna.trial.create_trial(value=1.95, user_attrs={PROMOTED_FROM_ATTR: 1}))
    _ran(study, 1, 2.5)  # exported before the promotion: from the first trial
    assert {n: r.loss for n, r in measured_standing(study).items()} == {4: 2.5}
    # The promoted trial stands for it, measured at 2.5: trial 0's 2.00 is below.
    assert pick_trial(study)[0].number == 0
    # Recorded once: the next session reading the same run adds nothing.
    assert record(study, [MeasuredRun("r", 1, 2.5)]) == 0


def test_cheapest_within_compares_what_full_runs_measured() -> None:
    study = _study()
    _ran(study, 1, 2.10)  # trial 1 measured 5 % above the best: out of 1 %
    assert pick_trial(study, within_pct=1.0)[0].number == 0
    _ran(study, 1, 2.005, "again")  # trained again, the most recent counts
    assert pick_trial(study, within_pct=1.0)[0].number == 1


def test_a_trial_by_number() -> None:
    trial, rule = pick_trial(_study(), trial=2)
    assert trial.number == 2 and "by hand" in rule
    with pytest.raises(BadInputError, match="trial 9 .* is not a complete trial"):
        pick_trial(_study(), trial=9)
    with pytest.raises(BadInputError, match="either --trial or --pick"):
        pick_trial(_study(), trial=2, within_pct=1.0)


def test_a_bad_rule_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--study-name", "x", "--storage", f"sqlite:///{tmp_path}/o.db", "--out",
            str(tmp_path / "p.yaml"), "--pick", "cheapest-within", "some"]  # fmt: skip
    assert run_cli(export_main, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pick must be 'best' or 'cheapest-within PCT'" in err[0]
    assert not (tmp_path / "p.yaml").exists()


def test_a_full_run_that_stopped_early_counts_by_its_best_checkpoint() -> None:
    """Early stopping ends full runs by default: the adapter its user keeps is the best
    checkpoint's, and the study reads that loss as the configuration's and says so."""
    study = _study()
    assert record(study, [MeasuredRun("early", 0, 2.004, best_step=120)]) == 1
    trial, rule = pick_trial(study)
    assert trial.number == 0
    assert rule == (
        "measured: its full run stopped early; its best, at step 120, was 2.0040, "
        "below trial 1's predicted 2.0100"
    )
    (ran,) = measured_standing(study).values()
    assert (ran.loss, ran.best_step) == (2.004, 120)
    # A study that recorded runs before early stops were read holds no best_step: finished.
    study.set_user_attr("full_run_measured:old", {"trial": 2, "loss": 2.5, "added_at": 1.0})
    assert measured_standing(study)[2].best_step is None
