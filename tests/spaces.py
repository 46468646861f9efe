"""Search spaces for study-level tests."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PACKING_CHOICE = "packing: {choice: [none, padding_free]}"


def unpacked_default_space(folder: Path) -> str:
    """The default space with packing off, written to `folder`; its path.

    Packed, the bundled data's short samples make a small share of a run one or two optimizer
    steps: a trial of one evaluation point. Tests that follow a trial's curve use this space;
    packed trials' steps and shares are tested in test_runspec.py and test_packing.py.
    """
    text = Path(str(resources.files("search_spaces") / "default.yaml")).read_text()
    assert PACKING_CHOICE in text, "the default space no longer samples packing this way"
    path = folder / "space-unpacked.yaml"
    path.write_text(text.replace(PACKING_CHOICE, "packing: none"))
    return str(path)
