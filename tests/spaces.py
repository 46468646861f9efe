"""Search spaces and samplers for study-level tests."""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

import pytest

from hpo.samplers import SAMPLER_NAMES

PACKING_CHOICE = "packing: {choice: [none, padding_free]}"
# Every sampler `make_sampler` builds, as test parameters (cmaes only where installed).
SAMPLERS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            name == "cmaes" and importlib.util.find_spec("cmaes") is None,
            reason="the cmaes package is not installed",
        ),
    )
    for name in SAMPLER_NAMES
]


def unpacked_default_space(folder: Path) -> str:
    """The default space with packing off, written to `folder`; its path.

    Packed, the bundled data's short samples make a small share of a run one or two optimizer
    steps: a trial of one evaluation point. Tests that follow a trial's curve use this space;
    packed trials' steps and shares are tested in test_trial_runs.py and test_packing.py.
    """
    text = Path(str(resources.files("search_spaces") / "default.yaml")).read_text()
    assert PACKING_CHOICE in text, "the default space no longer samples packing this way"
    path = folder / "space-unpacked.yaml"
    path.write_text(text.replace(PACKING_CHOICE, "packing: none"))
    return str(path)
