"""CLIMB on the wire: its dual step is a secure mean (`secure_mean`) of this purpose."""

from __future__ import annotations

__all__ = ["CLIMB_DUAL", "CLIMB_DUAL_LENGTH"]

CLIMB_DUAL = "climb.dual"
"""The ``purpose`` of CLIMB's dual step: a mean of ``[f_i, lambda_i]``."""
CLIMB_DUAL_LENGTH = 2
"""Values per dual report: ``[f_i, lambda_i]``."""
