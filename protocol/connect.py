"""The first connection, retried: a device or coordinator that boots before its broker.

A transport reconnects by itself once it has been connected (paho's
reconnect loop); the first `connect()` fails at once when the broker is not
up yet, which on a Pi after a power cut is the normal case. `connect_patiently`
makes a fresh transport per attempt (a failed one cannot be reused) and waits
a jittered, doubling delay between attempts, with one log line per attempt.
A refusal by the broker (bad credentials, an ACL that forbids the
subscriptions) is not retried: waiting does not fix a configuration.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from ursa.protocol.transport import (
    BrokerRefusedError,
    SubscriptionRefusedError,
    Transport,
    TransportError,
)

__all__ = ["ConnectAbortedError", "backoff_delays", "connect_patiently"]

logger = logging.getLogger("ursa.protocol")


class ConnectAbortedError(TransportError):
    """Stopped (the stop event was set) before the broker answered."""


def backoff_delays(
    min_s: float, max_s: float, rng: random.Random
) -> Callable[[int], float]:
    """``delay(attempt)``: doubling from ``min_s`` to ``max_s``, full jitter above half.

    Jitter spreads a fleet that lost the same broker, so its reconnects do not
    arrive in one burst when it comes back.
    """

    def delay(attempt: int) -> float:
        ceiling = min(max_s, min_s * 2.0 ** max(0, attempt - 1))
        return rng.uniform(ceiling / 2, ceiling)

    return delay


def connect_patiently(
    make: Callable[[], Transport],
    *,
    what: str,
    min_delay_s: float = 1.0,
    max_delay_s: float = 60.0,
    stop: threading.Event | None = None,
    max_attempts: int | None = None,
    rng: random.Random | None = None,
) -> Transport:
    """A connected transport from ``make()``, retrying until the broker is up.

    Args:
        make: Builds a new, unconnected transport (its handler and
            subscriptions set), once per attempt.
        what: Who connects, for the log lines ("device d3").
        min_delay_s: The first wait between attempts.
        max_delay_s: The longest wait.
        stop: Set it to give up (raises `ConnectAbortedError`).
        max_attempts: Give up after this many (None: never).
        rng: Jitter source (tests pass a seeded one).

    Raises:
        BrokerRefusedError: the broker refused (not retried).
        SubscriptionRefusedError: a subscription was refused (not retried).
        ConnectAbortedError: ``stop`` was set.
        TransportError: the last attempt's error after ``max_attempts``.
    """
    stop = stop or threading.Event()
    delay = backoff_delays(min_delay_s, max_delay_s, rng or random.Random())
    attempt = 0
    while True:
        attempt += 1
        transport = make()
        try:
            transport.connect()
        except (BrokerRefusedError, SubscriptionRefusedError):
            raise
        except TransportError as exc:
            if max_attempts is not None and attempt >= max_attempts:
                raise
            wait = delay(attempt)
            logger.warning(
                "%s: broker not reachable (attempt %d: %s); retrying in %.1f s",
                what,
                attempt,
                exc,
                wait,
            )
            if stop.wait(wait):
                raise ConnectAbortedError(f"{what}: stopped before connecting") from exc
            continue
        if attempt > 1:
            logger.info("%s: connected after %d attempts", what, attempt)
        return transport
