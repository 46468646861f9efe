"""Successive halving in data fraction: the rungs' config, their choice, their score, and a
study whose promotions resume their trials' checkpoints."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from analysis.search.schedule import DEFAULT_RUNGS, parse_rungs
from common.errors import BadInputError
from hpo.config import TrialConfig, load_config
from hpo.final_loss import loss_one_doubling_on
from hpo.keys import (
    CURVE_ATTR,
    FRACTION_ATTR,
    LAW_CURVE_ATTR,
    PROMOTED_FROM_ATTR,
    RUNG_ATTR,
    SCORED_BY_ATTR,
)
from hpo.pick import comparable_losses, pick_trial, rung_candidates, rung_of
from hpo.runner import run_study
from hpo.trial_runs import trial_schedule
from tests.configs import short_study
from tests.spaces import unpacked_default_space


def test_rungs_parse_in_order_and_bad_ones_name_the_entry() -> None:
    assert parse_rungs(DEFAULT_RUNGS, 0.02) == ((6, 0.12), (2, 0.44))
    assert parse_rungs(("none",), 0.02) == () and parse_rungs((), 0.02) == ()
    for bad, words in [
        (("6-0.12",), "K@F"),
        (("x@0.1",), "K@F"),
        (("6@0.01",), "(0.02, 1]"),  # not above the trial fraction
        (("2@0.1", "3@0.2"), "K <= the rung before's K"),  # more than the rung before
        (("2@0.3", "1@0.2"), "(0.3, 1]"),  # not further than the rung before
        (("0@0.3",), "1 <= K"),
    ]:
        with pytest.raises(BadInputError, match=r"rungs") as info:
            parse_rungs(bad, 0.02)
        assert words in str(info.value)
    # One --promote replaces the rungs; the flag's text reaches the config as a tuple.
    assert TrialConfig(promote=2, promote_fraction=0.3).promotions == ((2, 0.3),)
    assert load_config(None, {"rungs": "4@0.1,1@0.5"}).trial.promotions == ((4, 0.1), (1, 0.5))
    with pytest.raises(BadInputError, match="rungs"):
        load_config(None, {"rungs": ["4@0.1", "5@0.5"]})


def test_the_loss_one_doubling_on_is_the_last_loss_less_its_drop_since_half_the_data() -> None:
    # Half of 40 samples is 20: 2.5 there, 2.0 at the end: it would reach 1.5 at 80.
    assert loss_one_doubling_on([10, 20, 30, 40], [3.0, 2.5, 2.2, 2.0]) == pytest.approx(1.5)
    # Between evaluations: linear (half of 50 is 25, between 2.5 and 2.2).
    assert loss_one_doubling_on([10, 20, 30, 50], [3.0, 2.5, 2.2, 2.0]) == pytest.approx(1.65)
    # One point, or none that early: its drop since the first point.
    assert loss_one_doubling_on([40], [2.0]) == 2.0
    assert loss_one_doubling_on([30, 40], [2.4, 2.0]) == pytest.approx(1.6)


def _complete(study: optuna.Study, value: float, **attrs: object) -> None:
    trial = study.ask()
    for key, item in attrs.items():
        trial.set_user_attr(key, item)
    study.tell(trial, value)


def _scored(study: optuna.Study, kind: str, losses: list[float], value: float, **attrs: object) -> None:
    """A trial scored by `kind` at `value`, its curve `losses` at 16 samples a step."""
    curve = {
        "steps": list(range(1, len(losses) + 1)),
        "samples": [16 * (i + 1) for i in range(len(losses))],
        "losses": losses, "scheduler": "linear", "warmup_ratio": 0.0,
        "learning_rate": 1e-3, "full_run_steps": 100,
    }  # fmt: skip
    _complete(study, value, **{SCORED_BY_ATTR: kind, LAW_CURVE_ATTR: curve, **attrs})


def test_a_rung_whose_trials_were_scored_two_ways_ranks_them_by_what_they_measured() -> None:
    """The study's backtest may trust the law for some trials of a rung and not for others:
    a predicted end (3.91) then beat a loss measured at the same share of the data (4.89)
    although its own measured loss was higher (5.79; the demo study at seed 2, whose rung
    left behind the configuration that ended its full run 1.1 lower). Where the kinds mix,
    each is ranked by what it measured; where they do not, by its score."""
    study = optuna.create_study()
    _scored(study, "prediction", [6.6, 5.5, 4.90], 4.81)
    _scored(study, "loss_at_fidelity", [6.5, 5.6, 4.89], 4.89)
    _scored(study, "prediction", [6.7, 6.2, 5.79], 3.91)
    _scored(study, "prediction", [6.8, 6.6, 6.39], 6.39)
    trials = study.get_trials(deepcopy=False)
    assert comparable_losses(trials) == {0: 4.90, 1: 4.89, 2: 5.79, 3: 6.39}
    assert [t.number for t in rung_candidates(trials, 1, 2)] == [1, 0]
    alike = [t for t in trials if t.number != 1]  # all scored by their prediction
    assert comparable_losses(alike) == {0: 4.81, 2: 3.91, 3: 6.39}
    # The last rung: promoted trials scored one doubling on, one by its prediction.
    samples, measured, predicted = [16, 32, 48, 64], [6.5, 4.89, 3.6, 3.3], [6.6, 4.90, 3.9, 3.7]
    doubling = loss_one_doubling_on(samples, measured)  # 1.71
    promoted = {PROMOTED_FROM_ATTR: 1, RUNG_ATTR: 1}
    _scored(study, "loss_one_doubling_on", measured, doubling, **promoted)
    _scored(study, "prediction", predicted, 1.5, **{**promoted, PROMOTED_FROM_ATTR: 0})
    last = [t for t in study.get_trials(deepcopy=False) if t.number >= 4]
    assert comparable_losses(last) == {
        4: pytest.approx(doubling), 5: pytest.approx(loss_one_doubling_on(samples, predicted))
    }
    assert pick_trial(study)[0].number == 4  # 1.71 against 2.5 (its prediction of 1.5 aside)


def test_the_studys_end_refits_the_trials_best_by_what_they_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end of the study predicts again only its best standing trials: where the kinds
    mix, those best by what they measured, not the ones whose prediction ran lowest."""
    import hpo.export
    from analysis.curves.correction import LossCorrection
    from hpo.final_loss import TrialCurve, predict_final_loss

    study = optuna.create_study()
    for kind, losses, value in [
        ("prediction", [6.7, 6.2, 5.79], 3.91),
        ("prediction", [6.8, 6.6, 6.39], 4.2),
        ("loss_at_fidelity", [6.5, 5.6, 4.89], 4.89),
    ]:
        draft = optuna.create_study()  # the curve attribute `_scored` writes
        _scored(draft, kind, losses, value)
        curve = TrialCurve.from_attr(draft.trials[0].user_attrs[LAW_CURVE_ATTR])
        assert curve is not None
        fitted = predict_final_loss(curve, peers=[], full_run_samples=1600, correction=LossCorrection())
        _scored(study, kind, losses, value, **fitted.user_attrs())  # with the fit it recorded
    monkeypatch.setattr(hpo.export, "MAX_END_REFITS", 2)
    assert sorted(hpo.export.end_predictions(study)) == [0, 2]  # 5.79 and 4.89 measured


def test_a_rung_takes_the_best_of_the_rung_before_once_and_not_what_a_full_run_measured() -> None:
    study = optuna.create_study()
    for value in (3.0, 1.0, 2.0, 0.5):  # trials 0-3 at rung 0
        _complete(study, value)
    study.tell(study.ask(), state=optuna.trial.TrialState.PRUNED)  # trial 4: not a candidate
    trials = study.get_trials(deepcopy=False)
    # The 2 best (3 and 1); trial 3's configuration had a full run: the next best instead.
    assert [t.number for t in rung_candidates(trials, 1, 2)] == [3, 1]
    assert [t.number for t in rung_candidates(trials, 1, 2, measured={3})] == [1, 2]
    # Trial 1 continued (trial 5, rung 1): rung 1 does not queue it again. Rung 2 chooses
    # nothing from one trial; from two, the better.
    _complete(study, 0.9, **{PROMOTED_FROM_ATTR: 1, RUNG_ATTR: 1, FRACTION_ATTR: 0.2})
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in rung_candidates(trials, 1, 2)] == [3]
    assert rung_candidates(trials, 2, 1) == []
    _complete(study, 1.2, **{PROMOTED_FROM_ATTR: 3, RUNG_ATTR: 1, FRACTION_ATTR: 0.2})
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in rung_candidates(trials, 2, 1)] == [5]
    assert [t.number for t in rung_candidates(trials, 2, 5)] == [5]  # one left behind at least
    assert [rung_of(t) for t in trials] == [0, 0, 0, 0, 0, 1, 1]


def test_a_study_continues_its_best_from_their_checkpoints_rung_by_rung(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = short_study(
        tmp_path / "w",
        tiny_model_dir,
        {
            # Unpacked: packed, half an epoch of short samples is a few optimizer steps.
            "space": str(unpacked_default_space(tmp_path)),
            "study_name": "rungs",
            "n_trials": 3,
            "trial_fraction": 0.1,
            "trial_evals": 2,
            "epochs": 0.5,
            "eval_samples": 16,
            "rungs": "2@0.2,1@0.4",
            "profiles": ["fast", "balanced"],
            "sampler": "random",
            "seed": 3,
        },
    )
    summary = run_study(config, progress=False)
    study = optuna.load_study(study_name="rungs", storage=config.storage_url)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert [rung_of(t) for t in complete] == [0, 0, 0, 1, 1, 2]
    firsts = complete[:3]
    second = {t.user_attrs[PROMOTED_FROM_ATTR] for t in complete[3:5]}
    assert second == {t.number for t in sorted(firsts, key=lambda t: t.value)[:2]}  # type: ignore[arg-type, return-value]
    last = complete[5]
    assert last.user_attrs[PROMOTED_FROM_ATTR] == min(complete[3:5], key=lambda t: t.value).number  # type: ignore[arg-type, return-value]
    for trial in complete[3:]:
        before = next(t for t in trials if t.number == trial.user_attrs[PROMOTED_FROM_ATTR])
        # Resumed: it trained only the steps its rung adds, and its curve goes on from the
        # trial it continued (the same points first, its samples counted on from them).
        full_steps = trial.user_attrs["full_run_steps"]
        stops = [
            trial_schedule(full_steps, fraction=t.user_attrs["trial_fraction"], evals=2)
            .stop_after_steps
            for t in (before, trial)
        ]
        assert stops[1] > stops[0] and trial.user_attrs["trained_steps"] == stops[1] - stops[0]
        curve, earlier = trial.user_attrs[CURVE_ATTR], before.user_attrs[CURVE_ATTR]
        assert curve[: len(earlier)] == earlier and len(curve) > len(earlier)
        samples = [s for s, _ in curve]
        assert samples == sorted(samples) and len(set(samples)) == len(samples)
        assert trial.user_attrs[LAW_CURVE_ATTR]["steps"][-1] > before.user_attrs[LAW_CURVE_ATTR]["steps"][-1]
    # The last rung is scored one doubling on; the rungs before by their loss at fidelity.
    assert last.user_attrs["scored_by"] == "loss_one_doubling_on"
    assert {t.user_attrs["scored_by"] for t in complete[:5]} == {"loss_at_fidelity"}
    points = last.user_attrs[CURVE_ATTR]
    assert last.value == pytest.approx(
        loss_one_doubling_on([s for s, _ in points], [v for _, v in points]), rel=1e-6
    )
    # The configuration that went furthest is exported; no checkpoint is left behind.
    assert pick_trial(study)[0].number == last.number == summary.best_trial
    assert not list((tmp_path / "w" / "trials").glob("*/checkpoint-*"))


def test_a_longer_trial_fraction_keeps_the_default_rungs_beyond_it() -> None:
    assert TrialConfig(fraction=0.1).promotions == ((6, 0.12), (2, 0.44))
    assert TrialConfig(fraction=0.25).promotions == ((2, 0.44),)
    assert TrialConfig(fraction=0.5).promotions == ()
    # Rungs the user wrote are theirs: one not beyond the trial fraction is an error.
    with pytest.raises(BadInputError, match="rungs"):
        TrialConfig(fraction=0.25, rungs=("6@0.2",))
