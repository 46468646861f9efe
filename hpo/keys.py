"""Every study and trial attribute key hpo writes to an Optuna study, in one place.

A study's attributes outlive the process that wrote them: a worker joining later, the
export, the report and `analysis.calibrate` read them back, so a key is spelled once and
each says who writes it and who reads it. The keys `analysis` reads live in
`analysis.study_keys` (analysis may not import hpo) and are taken from there. Values are
JSON; a study made by an earlier version may lack any of them.
"""

from __future__ import annotations

from analysis.study_keys import (
    CONFIG_ATTR,
    END_PREDICTIONS_ATTR,
    ESTIMATE_ATTR,
    EXPERIMENT_ATTR,
    EXPORTED_ATTR,
    NEVER_TRAINED_ATTR,
    PARENT_ATTR,
    SEARCH_ATTR,
    STATE_REASON_ATTR,
    TIME_MODEL_RUN_ATTR,
)

__all__ = [
    "BEFORE_TRIALS_ATTR",
    "CONFIG_ATTR",
    "CURVE_ATTR",
    "DATA_ATTR",
    "DUPLICATE_OF_ATTR",
    "END_PREDICTIONS_ATTR",
    "ENDED_ATTR",
    "ESTIMATE_ATTR",
    "EXPERIMENT_ATTR",
    "EXPORTED_ATTR",
    "FIT_ATTR",
    "FRACTION_ATTR",
    "LAW_CURVE_ATTR",
    "LAW_FIT_ATTR",
    "LEGACY_SHAPE_CURVES_ATTR",
    "MEASUREMENT_ATTR",
    "METHOD_ATTR",
    "MLFLOW_RUN_ATTR",
    "MODEL_ATTR",
    "NEVER_TRAINED_ATTR",
    "PARENT_ATTR",
    "PLAN_ATTR",
    "POINTS_ATTR",
    "PREDICTED_ATTR",
    "PROMOTED_FROM_ATTR",
    "REDRAWN_ATTR",
    "REFERENCE_ATTR",
    "REPAIRED_ATTR",
    "RUNG_ATTR",
    "SCORED_BY_ATTR",
    "SEARCH_ATTR",
    "SHAPE_CURVE_PREFIX",
    "SPACE_ATTR",
    "STATE_REASON_ATTR",
    "STOPPED_ATTR",
    "TAIL_ATTR",
    "TIME_MODEL_RUN_ATTR",
    "WORKER_ATTR",
]

# -- on the study ---------------------------------------------------------------------------
# The resolved model folder and data file. Written by hpo.runner when the study is created;
# read by hpo.export (the preset's full run).
MODEL_ATTR = "hpo_model_path"
DATA_ATTR = "hpo_data_path"
# The space its trials were sampled from. Written and read by hpo.study_space (a later
# session of the study must sample the same space).
SPACE_ATTR = "hpo_space"
# The search plan its first session made (its fidelity is kept by later sessions); the
# seconds its sessions spent outside their trials (set-up, probe, gaps, closing); the
# longest close a session measured; the limit that ended its last session. Written and read
# by hpo.search_budget.
PLAN_ATTR = "search_plan"
BEFORE_TRIALS_ATTR = "search_before_trials_seconds"
TAIL_ATTR = "search_tail_seconds"
ENDED_ATTR = "search_ended_by"
# What the loss-shape reference run ran and fitted. Written by hpo.reference_run; read by
# hpo.reference_run and hpo.summary.
REFERENCE_ATTR = "reference_run"
# One attribute per run that went through a decay of its own (the reference run, a full run
# that reported back): SHAPE_CURVE_PREFIX + its source, so that two workers adding curves at
# once do not overwrite each other's. Written by hpo.final_loss.add_shape_curves (for
# hpo.reference_run); read by hpo.final_loss (every trial's fit takes them).
SHAPE_CURVE_PREFIX = "loss_shape_curve:"
# Studies made before 2026-11-25 kept those curves in one attribute, {source: curve}: read by
# hpo.final_loss, written by nothing now.
LEGACY_SHAPE_CURVES_ATTR = "loss_shape_curves"

# -- on a trial (user attributes) -----------------------------------------------------------
# Queued with a promotion by hpo.runner (`study.enqueue_trial`): the trial it continues and
# its rung (1, 2, ...; first trials have none: rung 0). Read by hpo.objective, hpo.pick and
# hpo.runner.
PROMOTED_FROM_ATTR = "promoted_from"
RUNG_ATTR = "rung"
# The trial's share of its full run. Queued with a promotion by hpo.runner and written for
# every trial by hpo.objective (its derived attributes); read by hpo.objective and hpo.pick.
FRACTION_ATTR = "trial_fraction"
# Queued by hpo.runner on a trial trained to measure the machine while nothing fits by the
# calibration; read by hpo.objective (it trains regardless of its check).
MEASUREMENT_ATTR = "measurement"
# A promotion queued twice (workers ending at once): the trial that runs it. Written by
# hpo.objective; read by the tests and a reader of the study.
DUPLICATE_OF_ATTR = "duplicate_of"
# The trial's MLflow run. Written by hpo.objective at the trial's end; read by hpo.objective
# (a promotion continues its first trial's run) and hpo.export (the preset's provenance).
MLFLOW_RUN_ATTR = "mlflow_run_id"
# The WorkerId that runs the trial. Written by hpo.workers when a worker takes it; read by
# hpo.workers (a dead worker's trials are failed).
WORKER_ATTR = "hpo_worker"
# The limit that cut a trial short. Written by hpo.search_budget; read by a reader of the
# study.
STOPPED_ATTR = "stopped_by"
# The trial's predicted final loss (`hpo.final_loss.FinalLoss.user_attrs`), written by
# hpo.objective at the trial's end: its [[samples_seen, val_loss], ...]; the uncorrected
# fit (CurveFit.to_dict); {p10, p50, p90} after the correction; its curve on its schedule
# (TrialCurve.to_attr); "joint", "own" or "fallback"; its own points behind the prediction;
# the law's fit the next trial starts from (StoredFit); and what scored it ("prediction", or
# "loss_at_fidelity" where that is less sure). Read by hpo.final_loss (the study's peers and
# refits), hpo.pick, hpo.export, hpo.summary and hpo.objective (a promotion's earlier points).
CURVE_ATTR = "val_curve"
FIT_ATTR = "curve_fit"
PREDICTED_ATTR = "predicted_final_loss"
LAW_CURVE_ATTR = "law_curve"
METHOD_ATTR = "final_loss_method"
POINTS_ATTR = "final_loss_points"
LAW_FIT_ATTR = "law_fit"
SCORED_BY_ATTR = "scored_by"

# -- on a trial (system attributes) ---------------------------------------------------------
# Draws the feasible sampler made for the trial, and whether it repaired the last one.
# Written and read by hpo.feasible_sampler (its redraw counts in the summary).
REDRAWN_ATTR = "hpo:redrawn"
REPAIRED_ATTR = "hpo:repaired"
