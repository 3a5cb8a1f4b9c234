"""Ids both sides derive from a message's meaning, never draw at random.

A device and the coordinator compute the same id for the same thing: a reply
sent twice (a restart, a repeat) carries the same `derived_id`, so the
receiver recognises one answer; a global model version's chunks carry
`model_transfer_id`, so a device that sees the chunks before the notice, or
is told only a version, knows what they are and can re-request what it
missed. Defined once, here, and imported by both runtimes.
"""

from __future__ import annotations

import hashlib

__all__ = ["derived_id", "model_transfer_id"]


def derived_id(*parts: object) -> str:
    """A deterministic message id (32 hex digits) from its meaning."""
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:32]


def model_transfer_id(federation: str, model: str, version: int) -> str:
    """The transfer id (32 hex digits) of a global model version."""
    text = f"ursa-model|{federation}|{model}|{version}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]
