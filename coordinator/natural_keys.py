"""The natural key of a device message: what makes a re-sent copy a duplicate.

A device sends one `Volunteer` and one `EncryptedDistribution` per round and
one `Registration` per key epoch (their message ids derive from the same
parts). The coordinator stores each as a record keyed by round or epoch and
device, so that record, not a ``seen`` row of the message id, recognises a
retransmission (`ursa.coordinator.store.CoordinatorStore.is_duplicate`): one
write per such message instead of two. Every other message keeps its
``seen`` row.
"""

from __future__ import annotations

from ursa.coordinator.store import NaturalKey
from ursa.protocol.messages import (
    BaseMessage,
    EncryptedDistribution,
    Registration,
    Volunteer,
)

__all__ = ["natural_key"]


def natural_key(message: BaseMessage) -> NaturalKey | None:
    """The stored record that will identify ``message``, or None (a ``seen`` row)."""
    if isinstance(message, Volunteer):
        return NaturalKey("volunteers", message.round, message.sender)
    if isinstance(message, EncryptedDistribution):
        return NaturalKey("distributions", message.round, message.sender)
    if isinstance(message, Registration):
        return NaturalKey("registrations", message.epoch, message.sender)
    return None
