"""A key epoch's working copy: the epoch as the coordinator works on it, and who draws.

`EpochWork` is the current key epoch (agent, recipients, notice, the relayed
key, the running registry sum, the sealing's pages, who registration still
waits for, the agent's check); `EpochSets` who its rounds draw from, kept
per device event. Both belong to `ursa.coordinator.key_epoch.KeyEpoch`; the
round cycle reads them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from ursa.coordinator.device_sets import IndexedDevices
from ursa.coordinator.registry_check import RegistryChecking
from ursa.coordinator.seal_pages import SealPaging
from ursa.crypto.paillier import EncryptedVector, PaillierPublicKey

__all__ = ["SEAL_PAGES_KEY", "EpochSets", "EpochWork", "sealed_through"]

logger = logging.getLogger("ursa.coordinator")

SEAL_PAGES_KEY = "seal_pages"
"""Store meta key: JSON ``{"epoch", "page_size", "done_through"}`` of the sealing."""


def sealed_through(raw: str | None, epoch: int, page_size: int) -> int:
    """Pages of `epoch` whose boxes were all relayed, from the stored meta value.

    0 when the record is of another epoch or another page size (a restart
    with another ``seal_page_size`` cuts other pages: all are sent again).
    """
    try:
        data = json.loads(raw or "{}")
        if (
            isinstance(data, dict)
            and data.get("epoch") == epoch
            and data.get("page_size") == page_size
        ):
            return max(0, int(data.get("done_through", 0)))
    except (ValueError, TypeError):
        logger.warning("ignoring an unreadable %s record", SEAL_PAGES_KEY)
    return 0


@dataclass
class EpochWork:
    """The current key epoch, as the coordinator works on it."""

    epoch: int
    agent: str
    recipients: tuple[str, ...]
    notice: bytes
    public_key: PaillierPublicKey | None = None
    public_key_msg: bytes | None = None
    running_sum: EncryptedVector | None = None
    registered: set[str] = field(default_factory=set)
    registry_sum_msg: bytes | None = None
    sealing: SealPaging | None = None
    """The agent's sealing, page by page (`ursa.coordinator.seal_pages`)."""
    sealed_at: float = float("-inf")
    """When a page was last sent or completed (a stalled agent is asked again)."""
    pending: set[str] | None = None
    """Online recipients not yet registered nor sitting out; built when
    registration opens, shrunk on each registration, departure and sit-out."""
    check: RegistryChecking | None = None
    """The agent's one-hot check of the registrations (registration closed)."""
    members: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.members = frozenset(self.recipients)

    def left(self, device: str) -> None:
        """`device` went offline or sits out: registration no longer waits for it."""
        if self.pending is not None:
            self.pending.discard(device)


@dataclass
class EpochSets:
    """Who a key epoch's rounds draw from, kept per device event (O(1) each).

    Built once per key epoch (or restart), then updated on every presence,
    enrolment, refusal, sit-out and registration change, so opening a round
    and topping it up never pass over the fleet.
    """

    work: EpochWork
    eligible: IndexedDevices
    """Registered in the epoch and in the online view (who a top-up draws)."""
    members_online: set[str]
    """The epoch's recipients (its starting fleet) that are online: churn."""
