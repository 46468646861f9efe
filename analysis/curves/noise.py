"""One evaluation's noise read off learning curves without a model, and the constants of
the robust bands built from it (shared by `analysis.curves.extrapolate` and `analysis.curves.law`).

Pure numpy: imports nothing from the project.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

Z90 = 1.2815515655446004  # standard normal quantile of 0.9
MAD_TO_SD = 1.482602218505602  # robust sd = this x median absolute deviation (normal data)


def chord_deviations(x: FloatArray, losses: FloatArray) -> FloatArray:
    """How far each inner point sits from the chord through its two neighbours.

    The chord is drawn in log x, where a power law is nearly straight, so the curve's own
    bend adds little; each deviation is scaled to the sd of one evaluation.
    """
    u = np.log(x)
    w = (u[2:] - u[1:-1]) / np.maximum(u[2:] - u[:-2], 1e-12)
    chord = w * losses[:-2] + (1.0 - w) * losses[2:]
    return np.asarray((losses[1:-1] - chord) / np.sqrt(1.0 + w**2 + (1.0 - w) ** 2), dtype=float)
