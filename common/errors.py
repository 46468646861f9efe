"""The project's one exception root.

`common` is the bottom layer, which every other package may import: the root lives here
and `trainers`, `search_spaces`, `analysis` and `hpo` import it from here.
"""

from __future__ import annotations

from typing import Any


class HpoError(Exception):
    """Root of every error this project raises on purpose."""


class BadInputError(HpoError, ValueError):
    """A problem the user can fix (bad file, bad value). Command lines exit 2 with one line."""


class TrainingFailed(HpoError):
    """A training run could not complete (NaN loss, out of memory, crash inside the loop)."""


class Diverged(TrainingFailed):
    """The loss became NaN/inf or ran away from its minimum (recovery may roll back).

    Attributes:
        safe_step: Roll back to a checkpoint saved at or before this step (None: the latest).
    """

    def __init__(self, message: str, *, safe_step: int | None = None) -> None:
        super().__init__(message)
        self.safe_step = safe_step


class GaveUp(TrainingFailed):
    """Recovery ran out of options (micro-batch 1 still out of memory, too many rollbacks).

    Attributes:
        result: What the run measured until it gave up (status ``gave_up``), when known.
    """

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result
