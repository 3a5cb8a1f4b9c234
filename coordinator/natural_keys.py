"""The natural key of a device message: what makes a re-sent copy a duplicate.

A device sends one `Registration` per key epoch, and a selection method may
take one answer per device and round (Dubhe's volunteers and distributions,
`SelectionMethod.natural_key`). The coordinator stores each as a record keyed
by epoch or round and device, so that record, not a ``seen`` row of the
message id, recognises a retransmission
(`ursa.coordinator.store.CoordinatorStore.is_duplicate`): one write per such
message instead of two. Every other message keeps its ``seen`` row.
"""

from __future__ import annotations

from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.store import NaturalKey
from ursa.protocol.messages import BaseMessage, Registration

__all__ = ["natural_key"]


def natural_key(
    message: BaseMessage, selection: SelectionMethod | None = None
) -> NaturalKey | None:
    """The stored record that will identify ``message``, or None (a ``seen`` row).

    ``selection``: the federation's selection method, asked about its own
    messages.
    """
    if isinstance(message, Registration):
        return NaturalKey.registration(message.epoch, message.sender)
    return None if selection is None else selection.natural_key(message)
