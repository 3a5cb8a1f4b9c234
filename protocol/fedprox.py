"""FedProx's wire contract: the signed ``mu`` both sides agree on.

FedProx (Li et al. 2020) adds ``(mu / 2) * ||w - w_global||^2`` to each
device's local loss; the coordinator aggregates as FedAvg. ``mu`` is the
federation's, not the device's: the coordinator signs it into every key
epoch (`KeyEpochStart.method_settings`) and a device trains with that value
only if it lies in ``[0, MAX_MU]``.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "DEFAULT_MU",
    "FEDPROX",
    "MAX_MU",
    "MU_SETTING",
    "FedProxMuError",
    "check_mu",
]

FEDPROX: Final = "fedprox"
"""The method's ``[[methods]]`` kind."""

MU_SETTING = "mu"
"""The name of the signed setting."""

DEFAULT_MU = 0.01
"""The coordinator's ``mu`` when its table gives none."""

MAX_MU = 10.0
"""Largest ``mu`` a device accepts (beyond it local training barely moves)."""


class FedProxMuError(ValueError):
    """A ``mu`` outside ``[0, MAX_MU]`` or not finite (said in one line)."""


def check_mu(mu: float) -> float:
    """``mu`` if it is finite and in ``[0, MAX_MU]``.

    Raises:
        FedProxMuError: otherwise.
    """
    if not math.isfinite(mu) or not 0.0 <= mu <= MAX_MU:
        raise FedProxMuError(
            f"FedProx mu must be finite and in [0, {MAX_MU}], got {mu}"
        )
    return mu
