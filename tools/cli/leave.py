"""Leaving a service process once it has stopped cleanly.

`ursa device run` and `ursa coordinator serve` stop their threads, close
their stores and flush their logs before they return. What is left at that
point are native threads and objects (torch's thread pools, onnxruntime,
paho's sockets) whose teardown at interpreter exit was seen to spin in the
final garbage collection for minutes: a device told to stop with SIGTERM
then never exited, and a supervisor (systemd, the fault suite) had to kill
it. Nothing is left to save, so these commands leave at once with their code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

__all__ = ["leave"]


def leave(code: int) -> NoReturn:
    """Flush the logs and standard streams, then end the process with ``code``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed: nothing to say
            stream.flush()
    os._exit(code)
