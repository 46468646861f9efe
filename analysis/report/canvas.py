"""One figure size, one look per trial state, and matplotlib imported only when drawing.

Every image is WIDTH_PX x HEIGHT_PX so pages lay out alike (and tests can check PNG sizes).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WIDTH_IN, HEIGHT_IN, DPI = 8.0, 5.0, 100
WIDTH_PX, HEIGHT_PX = int(WIDTH_IN * DPI), int(HEIGHT_IN * DPI)

# How each report state is drawn: (marker, colour, label).
STYLE = {
    "complete": ("o", "tab:blue", "complete"),
    "pruned": ("x", "tab:orange", "pruned (at its last reported loss)"),
    "failed": ("X", "tab:red", "failed"),
    "never_trained": ("v", "tab:gray", "never trained (over the budget)"),
}
BEST_COLOUR = "tab:green"
CYCLE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
MARKERS = ("o", "s", "^", "D", "v", "P")


@dataclass(frozen=True)
class Section:
    """One part of the report: a title, an image (None when skipped) and one line of reading.

    Attributes:
        title: The heading.
        image: The PNG's file name in the report folder, or None when the plot was skipped.
        reading: One sentence computed from the data (or why the plot was skipped).
    """

    title: str
    image: str | None
    reading: str


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_figure(ncols: int = 1) -> tuple[Figure, Any]:
    """A WIDTH_IN x HEIGHT_IN figure with `ncols` axes side by side."""
    plt = pyplot()
    fig, axes = plt.subplots(
        1, ncols, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained", squeeze=False
    )
    return fig, axes[0]


def save(fig: Figure, path: Path) -> None:
    """Write `fig` as a PNG of exactly WIDTH_PX x HEIGHT_PX and free it."""
    plt = pyplot()
    fig.set_size_inches(WIDTH_IN, HEIGHT_IN)
    try:
        with quiet():
            fig.savefig(path, dpi=DPI, format="png")  # no bbox_inches: it changes the size
    finally:
        plt.close(fig)


@contextmanager
def quiet() -> Iterator[None]:
    """Silence the warnings plotting raises on odd data (Optuna's experimental API, layout)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def fmt(value: float) -> str:
    """A number as a reader wants it in a sentence: 4 significant digits."""
    return f"{value:.4g}"
