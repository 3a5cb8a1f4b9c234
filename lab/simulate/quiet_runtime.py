"""The production runtime's loggers held at ERROR while a simulation drives it.

Their per-device lines (tofu trust, a window closing, a MADE loss reported)
say nothing about a simulated federation of hundreds of devices; errors
still show. The service engines (`ursa.lab.simulate.selection_service`,
`ursa.lab.simulate.feddisk_service`) wrap their runs in it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["RUNTIME_LOGGERS", "quiet_runtime"]

RUNTIME_LOGGERS = ("ursa.edge_sdk", "ursa.coordinator", "ursa.protocol", "ursa.compose")
"""The loggers of the device, the coordinator, the transport and composition."""


@contextmanager
def quiet_runtime() -> Iterator[None]:
    """`RUNTIME_LOGGERS` at ERROR inside the block, as they were after it."""
    loggers = [logging.getLogger(name) for name in RUNTIME_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
