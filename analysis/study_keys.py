"""The study and trial attribute keys `analysis` reads from an Optuna study.

`hpo` writes them; they live here because `analysis` may not import `hpo`, and `hpo.keys`
takes them from here, so each key is spelled once. Each says who writes it and who reads it.
"""

from __future__ import annotations

# -- on the study ---------------------------------------------------------------------------
# The study's configuration (`StudyConfig.to_dict`). Written by hpo.runner when the study is
# created; read by hpo.runner (a worker joining compares its own), hpo.export (the full run's
# settings, the work dir), analysis.calibrate (the work dir) and analysis.report (objectives).
CONFIG_ATTR = "hpo_config"
# The trial a preset was written for. Written by hpo.runner after its export; read by
# analysis.report.
EXPORTED_ATTR = "exported_trial"
# The search's plan against its spend. Written by hpo.runner; read by analysis.report.
SEARCH_ATTR = "search_spent"
# The study's MLflow parent run and experiment. Written by hpo.tracking; read by
# hpo.tracking (a later session continues the run), hpo.export, hpo.summary and
# analysis.report (its links).
PARENT_ATTR = "mlflow_parent_run_id"
EXPERIMENT_ATTR = "mlflow_experiment_id"
# {trial number: {p10, p50, p90, curves}}: the standing trials' final losses as the study's
# end predicted them again (`hpo.export.end_predictions`). Written by hpo.summary; read by
# analysis.report.
END_PREDICTIONS_ATTR = "end_predictions"

# -- on a trial -----------------------------------------------------------------------------
# A trained trial's time-model record: hardware, model, run (`trial_record`). Written by
# hpo.estimator; read by analysis.calibrate.
TIME_MODEL_RUN_ATTR = "time_model_run"
# The preset's `estimate` section as the trial's check and end left it. Written by
# hpo.estimator (and hpo.objective's final loss); read by hpo.export, hpo.pick and
# analysis.report.
ESTIMATE_ATTR = "estimate"
# Why a trial did not complete. Written by hpo.objective and hpo.workers (a dead worker's
# trial); read by hpo.runner, hpo.tracking and analysis.report.
STATE_REASON_ATTR = "state_reason"
# True on a trial refused before it trained. Written by hpo.objective; read by hpo.runner,
# hpo.search_budget and analysis.report.
NEVER_TRAINED_ATTR = "never_trained"
