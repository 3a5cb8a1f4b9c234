"""How FLICKER's device protocol refuses a message.

`ursa.edge_sdk.methods.flicker.participant.FlickerParticipant` reaches its
device through a `ursa.edge_sdk.method.PeerChannel` (an `EdgeClient`'s
`DeviceContext`, or the simulation's `ursa.lab.simulate.flicker_device`)
and refuses what it cannot take with `RefusedError`, which its host logs.
"""

from __future__ import annotations

from ursa.protocol.messages import ErrorCode
from ursa.protocol.router import RejectedError

__all__ = ["RefusedError"]


class RefusedError(RejectedError):
    """A FLICKER message this device refuses (the host logs the reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(ErrorCode.MALFORMED, reason)
