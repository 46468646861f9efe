"""The project's one exception root.

`trainers` sits at the bottom of the layers, so the root lives here and `hpo`,
`analysis` and `search_spaces` import it from here.
"""

from __future__ import annotations


class HpoError(Exception):
    """Root of every error this project raises on purpose."""


class BadInputError(HpoError, ValueError):
    """A problem the user can fix (bad file, bad value). Command lines exit 2 with one line."""


class TrainingFailed(HpoError):
    """A training run could not complete (NaN loss, out of memory, crash inside the loop)."""
