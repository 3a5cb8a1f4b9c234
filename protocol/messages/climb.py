"""CLIMB on the wire: its dual step is a secure mean (`secure_mean`) of this purpose."""

from __future__ import annotations

__all__ = ["CLIMB_DUAL", "CLIMB_DUAL_CIPHERTEXTS", "CLIMB_DUAL_LENGTH"]

CLIMB_DUAL = "climb.dual"
"""The ``purpose`` of CLIMB's dual step: a mean of ``[f_i, lambda_i]``."""
CLIMB_DUAL_LENGTH = 2
"""Values per dual report: ``[f_i, lambda_i]``."""
CLIMB_DUAL_CIPHERTEXTS = 1
"""Ciphertexts per dual report: two slots fit one plaintext of any key of at
least 512 bits while a slot is under 255 bits (a codec bound below about
2**200); the coordinator refuses a report of another count (``bad_ciphertext``),
so one device cannot make every other report unsummable."""
