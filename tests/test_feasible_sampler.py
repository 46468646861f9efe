"""TPE's joint proposals whose full run would not fit are drawn again before a trial starts
(`hpo.feasible_sampler`), instead of becoming trials that are refused untrained."""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path
from typing import Any

import optuna
import pytest

from analysis.timemodel.machine import model_profile
from analysis.timemodel.model import Coefficients
from hpo.feasible_sampler import ATTEMPTS, FeasibleSampler, redraw_counts, redraw_infeasible
from hpo.keys import MEASUREMENT_ATTR, REDRAWN_ATTR, REPAIRED_ATTR
from hpo.prepare import prepare
from hpo.runner import (
    MEASUREMENTS_WHEN_NOTHING_FITS,
    _judge_proposals,
    _when_nothing_fits,
    run_study,
)
from hpo.samplers import make_sampler
from hpo.summary import print_summary
from hpo.what_fits import Proposals, candidate_of, candidates
from search_spaces.sampling import sample
from tests.test_estimator import PINNED, PinnedEstimator, config_for, pinned

STARTUP = 5


def _toy_study(
    *, wrapped: bool, judge: Any = None, repair: Any = None, seed: int = 0
) -> optuna.Study:
    """An in-memory TPE study (group, multivariate, as `make_sampler`), wrapped or not."""
    study = optuna.create_study(sampler=make_sampler("tpe", seed=seed, n_startup_trials=STARTUP))
    if wrapped:
        study.sampler = FeasibleSampler(study.sampler, judge or (lambda p: p["x"] <= 2), repair)
    return study


def _to_two(params: Any) -> dict[str, Any]:
    return {**params, "x": 2}


def _toy_objective(trial: optuna.Trial) -> float:
    """Larger x scores better, but x > 2 "does not fit" and is refused, as the study does."""
    x = trial.suggest_categorical("x", [1, 2, 3, 4])
    y = trial.suggest_float("y", 0.0, 1.0)
    if x > 2:
        raise optuna.TrialPruned("would not fit")
    return -x + y


def _after_startup(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return sorted(study.trials, key=lambda t: t.number)[STARTUP:]


def test_proposals_that_would_not_fit_are_drawn_again_then_repaired() -> None:
    plain = _toy_study(wrapped=False)
    redrawn = _toy_study(wrapped=True)
    repaired = _toy_study(wrapped=True, repair=_to_two)
    for study in (plain, redrawn, repaired):
        study.optimize(_toy_objective, n_trials=30)

    def refused(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
        return [t for t in _after_startup(study) if t.params["x"] > 2]

    assert len(refused(plain)) >= 5  # TPE alone keeps proposing the better-looking misfits
    # Without a repair a misfit gets through only when every draw missed, and says so.
    assert refused(redrawn) != refused(plain)
    assert all(t.system_attrs[REDRAWN_ATTR] == ATTEMPTS for t in refused(redrawn))
    # With it, none gets through; the repaired trials are marked, the rest of TPE's kept.
    assert refused(repaired) == []
    marked = [t for t in repaired.trials if REPAIRED_ATTR in t.system_attrs]
    assert marked and all(t.params["x"] == 2 for t in marked)
    assert all(t.system_attrs[REDRAWN_ATTR] == ATTEMPTS for t in marked)
    sampler = repaired.sampler
    assert isinstance(sampler, FeasibleSampler) and sampler.repaired == len(marked)
    drawn = [t for t in repaired.trials if REDRAWN_ATTR in t.system_attrs]
    assert sampler.redrawn == sum(t.system_attrs[REDRAWN_ATTR] - 1 for t in drawn)


def test_enqueued_and_start_up_configurations_pass_unjudged() -> None:
    seen: list[dict[str, Any]] = []

    def judge(params: Any) -> bool:
        seen.append(dict(params))
        return params["x"] <= 2

    study = _toy_study(wrapped=True, judge=judge)
    study.optimize(_toy_objective, n_trials=STARTUP)  # random start-up: nothing to judge
    assert seen == []
    study.enqueue_trial({"x": 4, "y": 0.5})  # a user's choice is kept, misfit or not
    study.optimize(_toy_objective, n_trials=1)
    last = study.trials[-1]
    assert last.params["x"] == 4 and REDRAWN_ATTR not in last.system_attrs
    assert seen == []


def test_when_nothing_fits_the_last_draw_goes_on_to_be_refused() -> None:
    study = _toy_study(wrapped=True, judge=lambda params: False)
    study.optimize(_toy_objective, n_trials=STARTUP + 3)
    for trial in _after_startup(study):
        assert trial.system_attrs[REDRAWN_ATTR] == ATTEMPTS
    # An undecidable proposal (a choice missing) is not drawn again.
    undecided = _toy_study(wrapped=True, judge=lambda params: None)
    undecided.optimize(_toy_objective, n_trials=STARTUP + 3)
    assert all(REDRAWN_ATTR not in t.system_attrs for t in undecided.trials)


def test_a_misfit_redrawn_onto_what_cannot_be_judged_is_repaired() -> None:
    """TPE redraws onto a profile it has not modelled (its batch choices then drawn apart,
    unjudged): the misfit drawn first is repaired instead of letting the blind draw through."""
    judged: list[bool | None] = []
    repaired_from: list[dict[str, Any]] = []

    def judge(params: Any) -> bool | None:
        # Each trial's first draw is a misfit, its redraws cannot be told.
        verdict: bool | None = False if len(judged) % ATTEMPTS == 0 else None
        judged.append(verdict)
        return verdict

    def repair(params: Any) -> dict[str, Any]:
        repaired_from.append(dict(params))
        return _to_two(params)

    study = _toy_study(wrapped=True, judge=judge, repair=repair)
    study.optimize(_toy_objective, n_trials=STARTUP + 4)
    after = _after_startup(study)
    assert len(repaired_from) == len(after) == 4
    assert all(t.params["x"] == 2 and t.system_attrs[REPAIRED_ATTR] for t in after)
    # A proposal that cannot be told as first drawn still passes (exploration), unrepaired.
    undecided = _toy_study(wrapped=True, judge=lambda params: None, repair=repair)
    undecided.optimize(_toy_objective, n_trials=STARTUP + 2)
    assert len(repaired_from) == 4


def test_only_tpe_is_wrapped() -> None:
    for name in ("random", "nsga2", "gp"):
        study = optuna.create_study(sampler=make_sampler(name, seed=0))
        assert redraw_infeasible(study, lambda params: True) is None
        assert not isinstance(study.sampler, FeasibleSampler)
    study = optuna.create_study(sampler=make_sampler("tpe", seed=0))
    wrapper = redraw_infeasible(study, lambda params: True)
    assert wrapper is study.sampler and redraw_infeasible(study, lambda p: True) is wrapper


ALL_PROFILES = ["fast", "balanced", "quality", "memory_efficient"]


def _half_the_space_fits(model: Path, work: Path) -> tuple[Any, float]:
    """The prepared study (all four profiles, 20 epochs) and a window (seconds) between the
    two middle candidates' p90 by the pinned time model: half the candidates miss it."""
    probe = config_for(work, model, epochs=20.0, profiles=ALL_PROFILES)
    estimator = pinned(probe, prepare(probe))
    prepared = estimator.prepared  # the space the estimator lets the search propose
    p90 = sorted(
        estimator.verdict(c).full_run.seconds_p90 for c in candidates(prepared.space, ALL_PROFILES)
    )
    return prepared, math.sqrt(p90[len(p90) // 2 - 1] * p90[len(p90) // 2])


def test_the_study_judges_with_its_time_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    """On the real space and time model (pinned coefficients, all four profiles, a window
    half the candidates miss): every proposal after TPE's start-up fits, by the check a
    trial makes, drawn again or repaired where TPE alone proposes misfits."""
    prepared, window = _half_the_space_fits(tiny_model_dir, tmp_path)
    config = config_for(
        tmp_path,
        tiny_model_dir,
        epochs=20.0,
        profiles=ALL_PROFILES,
        window_hours=window / 3600,
        safety_margin_minutes=0.0,
    )
    estimator = pinned(config, prepared)
    context = types.SimpleNamespace(config=config, prepared=prepared, estimator=estimator)

    def run(wrapped: bool) -> list[bool]:
        study = optuna.create_study(sampler=make_sampler("tpe", seed=3, n_startup_trials=STARTUP))
        if wrapped:
            _judge_proposals(study, context)  # type: ignore[arg-type]
        fits = []
        for _ in range(STARTUP + 20):
            trial = study.ask()
            params = sample(trial, prepared.space, ALL_PROFILES)
            verdict = estimator.verdict(params)
            # The slower a configuration, the better it scores: TPE is drawn to the misfits.
            if verdict.feasible:
                study.tell(trial, -verdict.full_run.seconds_p50)
            else:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            frozen = study.trials[-1]
            if frozen.number >= STARTUP:
                fits.append(verdict.feasible)
            assert candidate_of(frozen.params, prepared.space) is not None
        return fits

    judged, plain = run(wrapped=True), run(wrapped=False)
    assert judged and all(judged)
    assert not all(plain)  # without the wrapper, TPE proposes misfits here


@pytest.mark.parametrize("missing", ["profile", "micro_batch_size@fast", "lora_r"])
def test_candidate_of_needs_every_time_relevant_choice(
    tiny_model_dir: Path, tmp_path: Path, missing: str
) -> None:
    prepared = prepare(config_for(tmp_path, tiny_model_dir))
    params = {
        "profile": "fast",
        "micro_batch_size@fast": 8,
        "gradient_accumulation_steps@fast": 2,
        "lora_r": 16,
        "packing": "none",
        "quantization": "none",
    }
    params = {
        k: v for k, v in params.items() if k in prepared.space.domains or "@" in k or k == "profile"
    }
    assert candidate_of(params, prepared.space)["micro_batch_size"] == 8  # type: ignore[index]
    assert candidate_of({k: v for k, v in params.items() if k != missing}, prepared.space) is None


def test_a_study_in_a_tight_window_trains_what_tpe_proposes(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real study (pinned time model, all four profiles, a window half the candidates
    miss): past TPE's start-up, no proposal is refused untrained unless every draw missed
    and no nearby configuration fit; the summary counts the redraws as the trials do."""
    prepared, window = _half_the_space_fits(tiny_model_dir, tmp_path)
    startup = 10  # make_sampler's TPE
    config = config_for(
        tmp_path,
        tiny_model_dir,
        study_name="tight",
        sampler="tpe",
        epochs=20.0,
        profiles=ALL_PROFILES,
        n_trials=startup + 6,
        window_hours=window / 3600,
        safety_margin_minutes=0.0,
    )
    summary = run_study(config, progress=False, estimator_factory=pinned)
    study = optuna.load_study(study_name="tight", storage=config.storage_url)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert len(trials) == startup + 6
    for trial in trials[startup:]:
        if "fixed_params" in trial.system_attrs:
            continue  # an enqueued feasible start
        if trial.user_attrs.get("never_trained"):
            assert trial.system_attrs.get(REDRAWN_ATTR) == ATTEMPTS
            assert REPAIRED_ATTR not in trial.system_attrs
        else:
            assert trial.user_attrs["estimate"]["fits_window"] is True
    assert summary.redrawn == redraw_counts(trials)
    print_summary(summary, {"host": "127.0.0.1", "port": 5000})
    printed = capsys.readouterr().out
    assert ("drawn again before training" in printed) == bool(summary.redrawn)


def test_once_nothing_fits_the_study_measures_then_stops(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A refusal measures nothing, so once no configuration fits by the study's calibration
    every later proposal would be refused: the fastest configuration is enqueued as a
    measurement a few times, then the study stops. Repairs stop scanning meanwhile."""
    profiles = ["fast", "balanced"]
    prepared = prepare(config_for(tmp_path, tiny_model_dir, profiles=profiles))

    def proposals_for(window_hours: float) -> Proposals:
        config = config_for(
            tmp_path, tiny_model_dir, profiles=profiles, window_hours=window_hours,
            safety_margin_minutes=0.0,
        )  # fmt: skip
        return Proposals(pinned(config, prepared), profiles)

    roomy, hopeless = proposals_for(1000.0), proposals_for(1e-6)
    assert not roomy.nothing_fits() and hopeless.nothing_fits()
    proposal = {
        "profile": "fast",
        **_fast_choices(prepared),
        "lora_r": 8,
        "packing": "none",
        "quantization": "none",
    }
    assert roomy.fits(proposal) is True
    assert hopeless.repair(proposal) is None and hopeless.fits(proposal) is None
    fastest, verdict = hopeless.fastest()
    p90 = [
        hopeless.estimator.verdict(c).full_run.seconds_p90
        for c in candidates(prepared.space, profiles)
    ]
    assert not verdict.feasible and verdict.full_run.seconds_p90 == min(p90)

    budget = types.SimpleNamespace(nothing_fits=False)
    context = types.SimpleNamespace(estimator=hopeless.estimator, budget=budget)

    def refused(trial: optuna.Trial) -> float:
        sample(trial, prepared.space, profiles)
        trial.set_user_attr("never_trained", True)
        raise optuna.TrialPruned

    study = optuna.create_study()
    callback = _when_nothing_fits(hopeless, context)  # type: ignore[arg-type]
    study.optimize(refused, n_trials=20, callbacks=[callback])
    trials = study.trials
    assert len(trials) == 1 + MEASUREMENTS_WHEN_NOTHING_FITS and budget.nothing_fits
    for trial in trials[1:]:
        assert trial.user_attrs[MEASUREMENT_ATTR] is True
        assert {k: trial.params[k] for k in fastest} == fastest
    # Where something fits, a refusal is one proposal's bad luck: the study goes on.
    budget.nothing_fits = False
    context.estimator = roomy.estimator
    study = optuna.create_study()
    study.optimize(refused, n_trials=3, callbacks=[_when_nothing_fits(roomy, context)])  # type: ignore[arg-type]
    assert len(study.trials) == 3 and not budget.nothing_fits


class TurnsSlowEstimator(PinnedEstimator):
    """The pinned rates until the first trial trains, then ten times slower: a calibration
    by which nothing fits any more (as one from a few noisy trials can be)."""

    @property
    def coefficients(self) -> Coefficients:
        if not self.observed:
            return PINNED
        slow = {f: getattr(PINNED, f) * 10 for f in SLOWED}
        return dataclasses.replace(PINNED, **slow, source="pinned-slow")

    def observe(self, *args: Any, **kwargs: Any) -> Any:
        self.observed = True
        return super().observe(*args, **kwargs)

    observed = False


SLOWED = (
    "micro_fixed_seconds", "micro_seconds_per_flop", "micro_seconds_per_adapter_flop",
    "micro_seconds_per_attention_flop", "optimizer_fixed_seconds", "startup_fixed_seconds",
)  # fmt: skip


def test_a_study_trains_its_measurements_and_stops(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A real study whose calibration turns against every configuration after its first
    trained trial: its measurements train though their check says they do not fit, are not
    exported while another trial fits (`hpo.pick`), and the study stops after them."""
    profiles = ["fast"]
    config = config_for(tmp_path, tiny_model_dir, epochs=20.0, profiles=profiles)
    prepared = prepare(config)
    estimator = TurnsSlowEstimator(config, prepared, model=model_profile(prepared.model_path))
    window = 2 * min(
        estimator.verdict(c).full_run.seconds_p90 for c in candidates(prepared.space, profiles)
    )
    config = config_for(
        tmp_path, tiny_model_dir, study_name="turns", epochs=20.0, profiles=profiles,
        n_trials=30, window_hours=window / 3600, safety_margin_minutes=0.0,
        search_hours=1.0,
    )  # fmt: skip

    def factory(config: Any, prepared: Any) -> TurnsSlowEstimator:
        return TurnsSlowEstimator(config, prepared, model=model_profile(prepared.model_path))

    summary = run_study(config, progress=False, estimator_factory=factory)
    study = optuna.load_study(study_name="turns", storage=config.storage_url)
    trials = sorted(study.trials, key=lambda t: t.number)
    measurements = [t for t in trials if t.user_attrs.get(MEASUREMENT_ATTR)]
    assert len(measurements) == MEASUREMENTS_WHEN_NOTHING_FITS
    for trial in measurements:
        assert not trial.user_attrs.get("never_trained") and "steps_seconds" in trial.user_attrs
        assert trial.constraints["duration"] > 0  # its check said it does not fit
    assert len(trials) < 30 and summary.search["ended_by"] == "nothing fits"
    # Their estimates say they do not fit: the pick passes over them while a trial fits.
    assert all(t.user_attrs["estimate"]["fits_window"] is False for t in measurements)


def _fast_choices(prepared: Any) -> dict[str, Any]:
    fast = prepared.space.profiles["fast"]
    return {
        "micro_batch_size@fast": fast.micro_batch_size[0],
        "gradient_accumulation_steps@fast": fast.gradient_accumulation_steps[0],
    }
