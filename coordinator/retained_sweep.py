"""The retained sweep: what is retained where no honest device retains is cleared.

A device retains only its status; the broker keeps anything retained for
good and sends it again at every subscription, so bytes a device (or an
attacker with its credentials) left retained on its up topics would be
replayed to the coordinator forever. The sweep subscribes to the device up
filter again every `RETAINED_SWEEP_S`; each retained message the broker
answers with there is deleted (an empty retained publish), logged once per
device per `LOG_INTERVAL_S` and never admitted. A new run also clears the
older run's retained notices (`clear_notices`).
"""

from __future__ import annotations

import logging

from ursa.coordinator.telemetry import Telemetry
from ursa.protocol.admission_limits import LOG_INTERVAL_S
from ursa.protocol.outbox import Outbox
from ursa.protocol.topics import (
    DEV,
    RETAINED_GLOBAL_NAMES,
    STATUS,
    UP,
    coordinator_subscriptions,
    federation_filter,
    global_topic,
)
from ursa.protocol.transport import Transport, TransportError

__all__ = ["RETAINED_SWEEP_S", "RetainedSweep"]

logger = logging.getLogger("ursa.coordinator")

RETAINED_SWEEP_S = 60.0
"""How often the device up filter is subscribed again, so that the broker
sends its retained messages there (which no honest device leaves) to be
cleared: a device's retained bytes live on the broker for at most this long."""


class RetainedSweep:
    """Clears retained messages from device up topics (module docstring).

    Args:
        federation: The federation whose topics are swept.
        outbox: Where the clearing publishes are queued.
        telemetry: Counts each cleared message as a rejection.
    """

    def __init__(self, federation: str, outbox: Outbox, telemetry: Telemetry) -> None:
        self._federation = federation
        self._outbox = outbox
        self._telemetry = telemetry
        self._logged: dict[str, float] = {}
        self._swept_at = 0.0
        self.cleared = 0
        """Retained messages on device up topics cleared so far."""

    def clear_notices(self) -> None:
        """A new run: delete an older run's retained notices from the broker.

        A coordinator started on an empty store under an existing federation
        name (a reset) must not leave devices the old run's key epoch, public
        key, registry sum or round to act on.
        """
        for name in sorted(RETAINED_GLOBAL_NAMES - {STATUS}):
            self._outbox.put(global_topic(self._federation, name), b"", 1, True)

    def on_retained(self, topic: str, payload: bytes, now: float) -> bool:
        """Clear ``topic`` if it is a device up topic; False: admit it as usual."""
        device = _up_device(self._federation, topic)
        if device is None:
            return False
        if not payload:
            return True  # a cleared one
        self.cleared += 1
        self._telemetry.rejected("retained")
        logged = self._logged.get(device)
        if logged is None or now - logged >= LOG_INTERVAL_S:
            self._logged[device] = now
            logger.warning(
                "cleared a retained message of %d bytes %s left on %r "
                "(devices never retain on their up topics)",
                len(payload),
                device,
                topic,
            )
        self._outbox.put(topic, b"", 1, True)
        return True

    def sweep(self, transport: Transport | None, now: float) -> None:
        """Subscribe to the device up filter again every `RETAINED_SWEEP_S`.

        The broker answers a subscription with the retained messages it
        matches; `on_retained` clears them.
        """
        if transport is None or not transport.is_connected:
            return
        if now - self._swept_at < RETAINED_SWEEP_S:
            return
        self._swept_at = now
        up_filter = coordinator_subscriptions(self._federation)[0]
        try:
            transport.subscribe(up_filter)
        except TransportError as exc:
            logger.warning("could not sweep retained messages: %s", exc)


def _up_device(federation: str, topic: str) -> str | None:
    """The device whose up subtree ``topic`` is in (any depth), else None."""
    prefix = federation_filter(federation)[:-1]  # "ursa/v1/<federation>/"
    if not topic.startswith(prefix):
        return None
    levels = topic[len(prefix) :].split("/")
    if len(levels) < 3 or levels[0] != DEV or levels[2] != UP or not levels[1]:
        return None
    return levels[1]
