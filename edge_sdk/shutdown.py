"""`run_until_signalled`: an app's device that stops cleanly on SIGTERM and SIGINT.

Under systemd (``systemctl stop``), in a container (``docker stop``) or at a
terminal (Ctrl-C) a device is told to stop by a signal. Python's default
SIGTERM kills the process at once: no ``offline`` status, no flushed
outbox. This helper turns SIGTERM and SIGINT into the client's stop event,
so `EdgeClient.run` publishes ``offline``, drains the outbox and closes the
connection; it logs ``stopping (SIGTERM)`` and ``stopped``, and returns the
signal's name (None when the federation ended first).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType

from ursa.edge_sdk.client import EdgeClient

__all__ = ["STOP_SIGNALS", "run_until_signalled"]

logger = logging.getLogger("ursa.edge_sdk")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop a device."""


def run_until_signalled(
    client: EdgeClient,
    *,
    poll_s: float = 1.0,
    until_finished: bool = True,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
) -> str | None:
    """Run ``client`` until a stop signal (or the federation's end), then stop it.

    Call it from the main thread (Python runs signal handlers there only);
    the previous handlers are back when it returns.

    Returns:
        The name of the signal that stopped the device, or None.

    Raises:
        RuntimeError: not called from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_until_signalled must run in the main thread")
    stop = threading.Event()
    received: list[str] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)  # logging here could deadlock
        stop.set()

    def say_stopping() -> None:  # a thread, not the handler, logs
        stop.wait()
        if received:
            logger.info("%s: stopping (%s)", client.device_id, received[0])

    watcher = threading.Thread(target=say_stopping, name="ursa-stop-note", daemon=True)
    watcher.start()
    previous = {signum: signal.signal(signum, handle) for signum in signals}
    try:
        client.run(stop, poll_s=poll_s, until_finished=until_finished)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stop.set()
        watcher.join(1.0)
    if not received:
        return None
    logger.info("%s: stopped", client.device_id)
    return received[0]
