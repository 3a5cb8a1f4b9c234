"""The two sums Dubhe computes under encryption, as a swappable simulator hook.

The selection simulator never adds registries or distributions itself: it
asks a `SumBackend` for (1) the overall registry, from each device's registry
slot, and (2) the per-try sums of the tentative members' distributions in
fixed point. `PLAINTEXT` adds integers with numpy; the encrypted backend
(`ursa.lab.simulate.encrypted_sums`) adds packed Paillier ciphertexts and decrypts
the same integers, so the selections that follow are identical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

DISTRIBUTION_SCALE = 1 << 20
"""Fixed-point scale of a device's distribution in the per-try sums."""

RegistrySum = Callable[[NDArray[np.int64], int], NDArray[np.int64]]
"""(each device's registry slot, registry length) -> the overall registry."""
TrySums = Callable[[NDArray[np.int64], NDArray[np.int64]], NDArray[np.int64]]
"""(N x C fixed-point distributions, R x H x K tentative sets) -> R x H x C sums.

Axis 0 is the round: a member sends its distribution once per round and the
coordinator adds it into every try of that round it belongs to.
"""
PhaseHook = Callable[[str], None]
"""Told which stage the next sums belong to ("search:<draw>" or "rounds:<draw>")."""


def plain_registry_sum(indices: NDArray[np.int64], length: int) -> NDArray[np.int64]:
    """The overall registry in plaintext: how many devices chose each slot."""
    return np.bincount(indices, minlength=length).astype(np.int64)


def plain_try_sums(
    fixed: NDArray[np.int64], selections: NDArray[np.int64]
) -> NDArray[np.int64]:
    """Per-try sums of the members' fixed-point distributions, in plaintext."""
    out: NDArray[np.int64] = fixed[selections].sum(axis=-2)
    return out


def _no_phase(name: str) -> None:
    """The plaintext backend does not account for stages."""


@dataclass(frozen=True)
class SumBackend:
    """Where the two protocol sums are computed (plaintext or encrypted)."""

    registry_sum: RegistrySum = plain_registry_sum
    try_sums: TrySums = plain_try_sums
    phase: PhaseHook = _no_phase


PLAINTEXT = SumBackend()
"""numpy sums of the same integers an encrypted backend decrypts."""
