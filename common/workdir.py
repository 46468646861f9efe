"""Every path under a study's work dir, named in one place.

What `python -m hpo.study --work-dir DIR` leaves there:

    optuna.db               the Optuna study (the default SQLite storage)
    optuna.journal          a journal storage that `--workers` may share (suggested, not made)
    mlflow.db               MLflow's store (the default SQLite tracking URI)
    mlartifacts/            the artifacts of the study's MLflow experiment
    mlflow-spool/           MLflow records waiting for a tracking server that did not answer
    calibration.json        the time model's and the loss correction's calibration
    cache/                  tokenized data, keyed by content, tokenizer and length
    models/                 the demo's tiny model
    trials/trial-NNN/       each trial's run
    presets/STUDY.yaml      the study's exported preset
    full/STUDY/             its full run (`trainers.train --preset`, without --output-dir)
    reports/STUDY/          the study's report
    workers/worker-I.log    what each local worker printed
"""

from __future__ import annotations

from pathlib import Path

SPOOL_DIR = "mlflow-spool"  # also in a full run's output folder
CALIBRATION_FILE = "calibration.json"


class WorkDir:
    """The layout of one work dir; nothing is created until a caller writes there.

    Args:
        root: The work dir, as given. Paths below it stay relative when it is, except the
            stores' URLs and the shared caches, which every process must find wherever it runs.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.journal = self.root / "optuna.journal"  # a storage `--workers` can share
        self.artifacts = self.root / "mlartifacts"
        self.spool = self.root / SPOOL_DIR
        self.calibration = self.root / CALIBRATION_FILE
        self.workers = self.root / "workers"
        absolute = self.root.resolve()
        self.cache = absolute / "cache"
        self.models = absolute / "models"
        self.optuna_url = f"sqlite:///{absolute / 'optuna.db'}"  # the default storage
        self.mlflow_url = f"sqlite:///{absolute / 'mlflow.db'}"  # the default tracking URI

    def __repr__(self) -> str:
        return f"WorkDir({str(self.root)!r})"

    def trial(self, number: int) -> Path:
        """Trial `number`'s output folder."""
        return self.root / "trials" / f"trial-{number:03d}"

    def preset(self, study_name: str) -> Path:
        return self.root / "presets" / f"{study_name}.yaml"

    def full_run(self, preset_name: str) -> Path:
        """Where a preset's full run goes without --output-dir."""
        return self.root / "full" / preset_name

    def report(self, study_name: str) -> Path:
        return self.root / "reports" / study_name

    def worker_log(self, index: int) -> Path:
        return self.workers / f"worker-{index}.log"
