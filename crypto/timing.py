"""Process-wide seconds spent in Paillier arithmetic, for an operator's metrics.

`timed` wraps the Paillier operations (`ursa.crypto.paillier`: encrypt,
add, sum, decrypt) and adds their wall time to one counter per process, so a
coordinator can export ``ursa_crypto_seconds_total`` without timing each call
site. Two perf_counter reads per call: noise next to a 2048-bit product.
In a process that runs several parties (tests, simulations) it is their sum.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["crypto_seconds", "timed"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

_lock = threading.Lock()
_total = [0.0]


def crypto_seconds() -> float:
    """Seconds this process has spent in timed crypto operations so far."""
    with _lock:
        return _total[0]


def timed(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Add each call's wall time to the process's crypto counter."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        started = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - started
            with _lock:
                _total[0] += elapsed

    return wrapper
