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
        root: The work dir, as given (relative paths stay relative, except in the URLs and
            the shared caches, which are absolute so that every process finds them).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"WorkDir({str(self.root)!r})"

    @property
    def optuna_db(self) -> Path:
        return self.root.resolve() / "optuna.db"

    @property
    def optuna_url(self) -> str:
        """The default Optuna storage: SQLite in the work dir."""
        return f"sqlite:///{self.optuna_db}"

    @property
    def journal(self) -> Path:
        """The journal file that several local workers can share instead of SQLite."""
        return self.root / "optuna.journal"

    @property
    def mlflow_url(self) -> str:
        """The default MLflow tracking URI: SQLite in the work dir."""
        return f"sqlite:///{self.root.resolve() / 'mlflow.db'}"

    @property
    def artifacts(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def spool(self) -> Path:
        return self.root / SPOOL_DIR

    @property
    def calibration(self) -> Path:
        return self.root / CALIBRATION_FILE

    @property
    def cache(self) -> Path:
        return self.root.resolve() / "cache"

    @property
    def models(self) -> Path:
        return self.root.resolve() / "models"

    def trial(self, number: int) -> Path:
        """Trial `number`'s output folder."""
        return self.root / "trials" / f"trial-{number:03d}"

    def preset(self, study_name: str) -> Path:
        return self.root / "presets" / f"{study_name}.yaml"

    def report(self, study_name: str) -> Path:
        return self.root / "reports" / study_name

    @property
    def workers(self) -> Path:
        return self.root / "workers"

    def worker_log(self, index: int) -> Path:
        return self.workers / f"worker-{index}.log"
