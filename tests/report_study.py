"""A small real Optuna study shaped like the ones `python -m hpo.study` leaves, for report tests.

Trials are added with `study.add_trial` and carry the user attributes the objective records
(validation curves fitted by `analysis.curves.extrapolate.fit_curve`, estimates, timings), so a
report is drawn from the same shapes without training anything.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import optuna

from analysis.curves.extrapolate import fit_curve

FULL_RUN_SAMPLES = 6400
PROFILES = {"fast": (16, 1), "balanced": (8, 2), "quality": (4, 4)}
D = optuna.distributions
SPACE = {
    "profile": D.CategoricalDistribution(list(PROFILES)),
    "learning_rate": D.FloatDistribution(5e-5, 5e-3, log=True),
    "lora_r": D.CategoricalDistribution([4, 8, 16, 32]),
    "lora_dropout": D.FloatDistribution(0.0, 0.1),
}
T0 = dt.datetime(2025, 3, 1, 9, 0, 0)


def _trial(number: int, state: str, rng: np.random.Generator, *, rich: bool) -> Any:
    """One finished trial with the user attributes hpo's objective records (`rich`), or none."""
    profile = list(PROFILES)[number % 3]
    micro, accumulation = PROFILES[profile]
    lora_r = [4, 8, 16, 32][number % 4]
    params: dict[str, Any] = {
        "profile": profile,
        "learning_rate": float(10 ** rng.uniform(-4.3, -2.3)),
        "lora_r": lora_r,
        "lora_dropout": float(rng.uniform(0, 0.1)),
    }
    rank = list(PROFILES).index(profile)  # slower profiles see longer sequences: lower loss
    hours = (0.5, 0.9, 1.6)[rank] * (1 + lora_r / 32)
    attrs: dict[str, Any] = {
        "profile": profile,
        "micro_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "estimate": {
            "duration_hours": {"p10": hours * 0.85, "p50": hours, "p90": hours * 1.2},
            "cost": hours * 2.5,
            "price_per_hour": 2.5,
            "peak_memory_gb": 1.5 + micro * 0.1,
        },
    }
    value = None
    intermediate: dict[int, float] = {}
    seconds = 0.2
    if state == "never_trained":
        # Either rule marks a never-trained trial: the attribute, or the time model's reason.
        if number < 5:
            attrs.update(never_trained=True, state_reason="over the memory limit")
        else:
            attrs["state_reason"] = f"predicted {hours:.1f} h (p90 {hours * 1.2:.1f} h) > 2.0 h"
    elif state in ("complete", "pruned"):
        seconds = 40.0 + 10 * number
        predicted = seconds * float(rng.uniform(0.8, 1.25))
        attrs.update(
            tokens_per_second=900.0 * micro / (1 + 0.1 * accumulation) * rng.uniform(0.9, 1.1),
            predicted_trial_seconds=predicted,
            predicted_trial_seconds_p10=predicted * 0.85,
            predicted_trial_seconds_p90=predicted * 1.15,
            measured_trial_seconds=seconds,
            peak_memory_bytes=int((1.4 + micro * 0.11) * 1024**3),
        )
        samples = np.arange(64, 704, 64, dtype=float)
        level = 1.85 - 0.04 * rank - 0.002 * lora_r + float(rng.normal(0, 0.01))
        losses = level + 1.2 * (samples / 64) ** -0.5 + rng.normal(0, 0.004, samples.size)
        intermediate = {int(s): float(v) for s, v in zip(samples, losses, strict=True)}
        if rich:
            fit = fit_curve(samples, losses, FULL_RUN_SAMPLES, bootstrap=30, seed=number)
            band = {k: round(getattr(fit, k) * 0.97, 6) for k in ("p10", "p50", "p90")}
            attrs.update(
                val_curve=[
                    [int(s), round(float(v), 6)] for s, v in zip(samples, losses, strict=True)
                ],
                curve_fit=fit.to_dict(),
                predicted_final_loss=band,
            )
            value = band["p50"]
        else:
            value = float(losses[-1])
        if state == "pruned":
            intermediate = dict(list(intermediate.items())[:4])
            attrs["state_reason"] = "pruned by median at step 4"
    else:  # failed
        seconds = 5.0
        attrs["state_reason"] = "RuntimeError: CUDA out of memory"
    if not rich:
        attrs = {k: v for k, v in attrs.items() if k in ("state_reason", "never_trained")}
    start = T0 + dt.timedelta(seconds=70 * number)
    return optuna.trial.FrozenTrial(
        number=number,
        state={
            "complete": optuna.trial.TrialState.COMPLETE,
            "failed": optuna.trial.TrialState.FAIL,
        }.get(state, optuna.trial.TrialState.PRUNED),
        value=value if state == "complete" else None,
        datetime_start=start,
        datetime_complete=start + dt.timedelta(seconds=seconds),
        params=params,
        distributions=SPACE,
        user_attrs=attrs,
        system_attrs={},
        intermediate_values=intermediate,
        trial_id=number,
    )


# Trial states in study order: complete trials, two pruned, two never trained, one failed.
LAYOUT = ["complete"] * 3 + ["never_trained", "pruned"] + ["complete"] * 4 + [
    "never_trained", "complete", "pruned", "failed",
]  # fmt: skip


def build_study(
    storage: str, name: str, *, layout: list[str] = LAYOUT, rich: bool = True
) -> optuna.Study:
    """A study like `python -m hpo.study` leaves, in `storage`."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage)
    rng = np.random.default_rng(7)
    for number, state in enumerate(layout):
        study.add_trial(_trial(number, state, rng, rich=rich))
    study.set_user_attr("mlflow_parent_run_id", "0123abcd")
    study.set_user_attr("mlflow_experiment_id", "1")
    if layout.count("complete") > 1:  # hpo.export wrote a preset for the second complete trial
        study.set_user_attr(
            "exported_trial", layout.index("complete", layout.index("complete") + 1)
        )
    return study
