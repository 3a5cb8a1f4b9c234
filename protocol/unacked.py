"""`Unacked`: publishes handed to paho and not yet acknowledged, for `flush`.

paho reports a PUBACK (and the write of a QoS 0 message) by packet id in
`on_publish`. With paho's own network thread that callback can run before
``publish()`` has returned the id to the caller, so an id acknowledged first
is remembered and cancels the publish recorded after it. `MqttPool` also
counts publishes from other threads that are still on their way to its loop
(`hand_off` / `handed`): `flush` waits for those too.
"""

from __future__ import annotations

import threading

from ursa.protocol.transport import NotConnectedError, TransportTimeoutError

__all__ = ["Unacked"]


class Unacked:
    """Packet ids awaiting their acknowledgement; `wait` blocks until none."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._mids: set[int] = set()
        self._qos0_mids: set[int] = set()
        self._early_acks: set[int] = set()
        self._handoffs = 0
        self._closed = False

    def __len__(self) -> int:
        """Publishes not yet acknowledged (those still being handed off included)."""
        with self._cond:
            return len(self._mids) + self._handoffs

    def published(self, mid: int, qos: int) -> None:
        """Record a publish paho accepted as packet `mid` (QoS >= 1 awaits a PUBACK)."""
        with self._cond:
            if mid in self._early_acks:
                self._early_acks.discard(mid)
            elif qos > 0:
                self._mids.add(mid)
            else:
                self._qos0_mids.add(mid)

    def acked(self, mid: int) -> None:
        """Record the ack of `mid` (a PUBACK, or a QoS 0 message written)."""
        with self._cond:
            if mid in self._mids:
                self._mids.discard(mid)
                self._cond.notify_all()
            elif mid in self._qos0_mids:
                self._qos0_mids.discard(mid)
            else:
                self._early_acks.add(mid)

    def hand_off(self) -> None:
        """Count a publish on its way to paho on another thread."""
        with self._cond:
            self._handoffs += 1

    def handed(self) -> None:
        """A publish counted by `hand_off` reached paho (or failed)."""
        with self._cond:
            self._handoffs -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """The link is closed for good: no acknowledgement comes any more."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, timeout_s: float, client_id: str) -> None:
        """Wait until every publish recorded so far is acknowledged.

        Raises:
            NotConnectedError: closed while some were still unacknowledged.
            TransportTimeoutError: some still unacknowledged after `timeout_s`.
        """
        with self._cond:
            done = self._cond.wait_for(
                lambda: not (self._mids or self._handoffs) or self._closed, timeout_s
            )
            waiting = len(self._mids) + self._handoffs
        if waiting:
            if done:
                raise NotConnectedError(f"{client_id} closed before PUBACKs")
            raise TransportTimeoutError(
                f"{waiting} publishes unacknowledged after {timeout_s} s"
            )
