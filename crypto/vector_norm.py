"""The L2 norm of a vector, computed on the calling thread.

Not ``np.linalg.norm``: its BLAS dot wakes OpenBLAS's worker threads, which
then spin for milliseconds after the call, a CPU cost larger than the norm
itself on every core of a Pi (and counted against whatever runs next). A
ufunc sum of squares stays on this thread; clipping and conditional rounding
call it on every round's full model vector.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["l2_norm"]


def l2_norm(values: ArrayLike) -> float:
    """``sqrt(sum(values**2))`` in float64 (inf or NaN for a non-finite input)."""
    vector = np.asarray(values, dtype=np.float64)
    return math.sqrt(float(np.add.reduce(np.square(vector), axis=None)))
