"""Dubhe's own part of the coordinator's store: each round's answers and tries.

The core store knows rounds and key epochs, not Dubhe: a round's volunteers
(each device's H draws), the members' encrypted distributions, the tentative
sets and the candidates sent to the agent, and each registrant's one-time
rank key of the stratified draw (sent with its registration; the registry
ciphertext beside it is the key epoch's, `CoordinatorStore.registry_blobs`)
are kept here, under Dubhe's method name, in the store's generic method
tables (`CoordinatorStore.add_method_row`: one row per device and round or
epoch, so an answer costs one write; `method_state`: one JSON value per round
for the tries and the candidates). A `random` federation's store holds none
of it.

A device sends one `Volunteer` and one `EncryptedDistribution` per round:
their rows are their de-duplication (`natural_key`), so a re-sent copy needs
no ``seen`` row. The coordinator sees draws and ciphertexts only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ursa.coordinator.store import CoordinatorStore, NaturalKey
from ursa.protocol.messages import BaseMessage, EncryptedDistribution, Volunteer

__all__ = [
    "CANDIDATES",
    "DISTRIBUTIONS",
    "NAMESPACE",
    "RANK_KEYS",
    "TRIES",
    "VOLUNTEERS",
    "DubheRecords",
    "DubheRound",
    "natural_key",
]

NAMESPACE = "dubhe"
"""Dubhe's method name in the store (its ``method_rows`` and ``method_state``)."""
VOLUNTEERS = "volunteers."
"""Row key prefix of a round's volunteers (``volunteers.<round>``): the draws."""
DISTRIBUTIONS = "distributions."
"""Row key prefix of a round's encrypted distributions: the ciphertext bytes."""
TRIES = "tries."
"""State key prefix of a round's tentative sets (JSON lists of device ids)."""
CANDIDATES = "candidates."
"""State key prefix of the tries sent to the agent, in the order of its sums."""
RANK_KEYS = "rank_keys."
"""Row key prefix of a key epoch's rank keys (``rank_keys.<epoch>``): the
registrants' one-time X25519 public keys of the stratified draw's hand-out."""


@dataclass(frozen=True)
class DubheRound:
    """What Dubhe kept of one round."""

    volunteers: dict[str, tuple[bool, ...]]
    tries: tuple[tuple[str, ...], ...] | None
    distributions: dict[str, bytes]
    candidates: tuple[int, ...] | None


def natural_key(message: BaseMessage) -> NaturalKey | None:
    """The row that will identify ``message`` (None: not a per-round answer)."""
    if isinstance(message, Volunteer):
        return NaturalKey.method_row(
            NAMESPACE, f"{VOLUNTEERS}{message.round}", message.sender
        )
    if isinstance(message, EncryptedDistribution):
        return NaturalKey.method_row(
            NAMESPACE, f"{DISTRIBUTIONS}{message.round}", message.sender
        )
    return None


class DubheRecords:
    """Dubhe's rounds in ``store`` (writes join the caller's transaction)."""

    def __init__(self, store: CoordinatorStore) -> None:
        self._store = store

    def add_volunteer(
        self, round_index: int, device: str, draws: tuple[bool, ...]
    ) -> None:
        """A device's answer to the announce (a second one raises)."""
        value = json.dumps([bool(d) for d in draws]).encode()
        self._store.add_method_row(
            NAMESPACE, f"{VOLUNTEERS}{round_index}", device, value
        )

    def add_distribution(self, round_index: int, device: str, blob: bytes) -> None:
        """A try member's encrypted distribution, as it arrived."""
        self._store.add_method_row(
            NAMESPACE, f"{DISTRIBUTIONS}{round_index}", device, blob
        )

    def set_tries(self, round_index: int, tries: tuple[tuple[str, ...], ...]) -> None:
        """The H tentative sets."""
        self._store.set_method_state(
            NAMESPACE, f"{TRIES}{round_index}", [list(t) for t in tries]
        )

    def set_candidates(self, round_index: int, candidates: tuple[int, ...]) -> None:
        """Which tries were sent to the agent, in the order of its sums."""
        self._store.set_method_state(
            NAMESPACE, f"{CANDIDATES}{round_index}", list(candidates)
        )

    def add_rank_key(self, epoch: int, device: str, rank_key: bytes) -> None:
        """A registrant's one-time rank key (in its registration's transaction)."""
        self._store.add_method_row(NAMESPACE, f"{RANK_KEYS}{epoch}", device, rank_key)

    def rank_entries(self, epoch: int) -> dict[str, tuple[bytes, bytes]]:
        """Device -> (registry ciphertext, rank key) of the epoch's registrants.

        The registrants the agent's check kept (the key epoch's registries)
        that sent a rank key: a dropped registrant's key is not handed out.
        """
        keys = self._store.method_rows(NAMESPACE, f"{RANK_KEYS}{epoch}")
        return {
            device: (registry, keys[device])
            for device, registry in self._store.registry_blobs(epoch).items()
            if device in keys
        }

    def drop_rank_keys(self, epoch: int) -> None:
        """Forget the epoch's rank keys: its hand-out is complete."""
        self._store.drop_method_rows(NAMESPACE, f"{RANK_KEYS}{epoch}")

    def volunteer_count(self, round_index: int) -> int:
        """How many devices answered the round's announce."""
        return self._store.count_method_rows(NAMESPACE, f"{VOLUNTEERS}{round_index}")

    def round(self, round_index: int) -> DubheRound:
        """Everything kept of a round (empty for a round Dubhe never saw).

        Raises:
            ValueError: a stored value is not what Dubhe wrote.
        """
        store = self._store
        volunteers = {
            device: _draws(value)
            for device, value in store.method_rows(
                NAMESPACE, f"{VOLUNTEERS}{round_index}"
            ).items()
        }
        tries = store.method_state(NAMESPACE, f"{TRIES}{round_index}")
        candidates = store.method_state(NAMESPACE, f"{CANDIDATES}{round_index}")
        return DubheRound(
            volunteers=volunteers,
            tries=None if tries is None else tuple(tuple(map(str, t)) for t in tries),
            distributions=store.method_rows(NAMESPACE, f"{DISTRIBUTIONS}{round_index}"),
            candidates=None if candidates is None else tuple(map(int, candidates)),
        )


def _draws(value: bytes) -> tuple[bool, ...]:
    draws = json.loads(value)
    if not isinstance(draws, list):
        raise ValueError("stored draws are not a list")
    return tuple(bool(d) for d in draws)
