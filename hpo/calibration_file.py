"""The work dir's calibration file, shared by every worker of a study and by later studies.

Each worker refits from its own trials and saves; another worker may have saved in the
meantime, so a save first merges in what the file holds.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from analysis.calibration.file import Calibration, load_for
from common.workdir import WorkDir

log = logging.getLogger(__name__)


class CalibrationFile:
    """The calibration of one hardware + model fingerprint in a work dir.

    Args:
        work_dir: The study's work dir (the file is `calibration.json` there).
        fingerprint: The hardware + model fingerprint a calibration must match.
    """

    def __init__(self, work_dir: str | Path, fingerprint: str) -> None:
        self.path = WorkDir(work_dir).calibration
        self.fingerprint = fingerprint

    def load(self) -> Calibration | None:
        """The file's calibration; None (with a warning) when it is for another fingerprint."""
        calibration, warning = load_for(self.path, self.fingerprint)
        if warning:
            log.warning(warning)
        return calibration

    def merged(self, ours: Calibration | None) -> Calibration | None:
        """`ours`, merged with the file when another worker has written it since."""
        on_disk, _ = load_for(self.path, self.fingerprint)
        if on_disk is None or ours is None:
            return on_disk or ours
        if on_disk.calibration_id == ours.calibration_id:
            return ours
        mine = [r for r in ours.runs if r not in on_disk.runs]
        merged = dataclasses.replace(on_disk, runs=(*on_disk.runs, *mine))
        return merged.with_loss_runs([r for r in ours.loss_runs if r not in on_disk.loss_runs])

    def save(self, calibration: Calibration) -> None:
        """Write `calibration` (atomically: a reader never sees half a file)."""
        calibration.save(self.path)
