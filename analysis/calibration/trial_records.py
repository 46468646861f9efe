"""Each trial's record of what the time model's calibration is fitted from.

A study writes it (`hpo.estimator`); `python -m analysis.calibrate` reads it back. The
names live here, below both, so neither imports the other's module. The calibration file
itself is `common.workdir.WorkDir.calibration`, read and written by `analysis.calibration.file`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from analysis.calibration.measurements import RunMeasurements
from analysis.timemodel.hardware import HardwareInfo
from analysis.timemodel.model import ModelProfile


def trial_record(
    hardware: HardwareInfo, model: ModelProfile, run: RunMeasurements
) -> dict[str, Any]:
    """What a study stores per trained trial so that the calibration can be refit from it."""
    return {
        "hardware": dataclasses.asdict(hardware),
        "model": dataclasses.asdict(model),
        "run": run.to_dict(),
    }


def read_trial_record(
    record: Mapping[str, Any],
) -> tuple[HardwareInfo, ModelProfile, RunMeasurements]:
    """The hardware, model and measurements `trial_record` stored.

    Raises:
        KeyError: A section is missing.
        TypeError: A section has unknown or missing fields.
    """
    return (
        HardwareInfo(**record["hardware"]),
        ModelProfile(**record["model"]),
        RunMeasurements.from_result_dict(record["run"]),
    )
