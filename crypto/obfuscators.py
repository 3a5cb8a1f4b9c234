"""A pool of precomputed Paillier obfuscators ``r**n mod n**2``, each used once.

Encryption costs one ``r**n mod n**2`` (~7.6 ms at 2048 bits) plus one modular
multiplication (~4 us). A device can compute the expensive part in idle time:
the pool fills itself in a background daemon thread (gmpy2 releases the GIL
there, so the device's main thread keeps running) and `take` hands out each
value exactly once.

Why this is safe, and when it is not: a value used twice makes two ciphertexts
whose quotient reveals the difference of their plaintexts. The pool pops every
value it hands out, never persists or pickles them, forgets them on `close`,
and empties itself in a forked child (parent and child would otherwise hold the
same values). It cannot stop a caller from reusing an int it was given.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from types import TracebackType
from typing import Any

import gmpy2

from ursa.crypto.paillier_keys import PaillierPublicKey

_POOLS: weakref.WeakSet[ObfuscatorPool] = weakref.WeakSet()


class ObfuscatorPool:
    """Precomputed ``r**n mod n**2`` values, each used once.

    Filled in a background daemon thread; never written to disk. Close it (or
    use it as a context manager) to stop the thread and drop unused values.
    """

    def __init__(
        self, public_key: PaillierPublicKey, capacity: int, *, background: bool = True
    ) -> None:
        """Create a pool for ``public_key`` holding up to ``capacity`` values.

        Args:
            public_key: The key the obfuscators are for.
            capacity: Most values kept ready (each is ~2 * key size in memory).
            background: Start a daemon thread that keeps the pool full; when
                False, the pool is filled only by `fill`.
        """
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError("capacity must be an int")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.public_key = public_key
        self._capacity = capacity
        self._background = background
        self._closed = False
        self._values: deque[int] = deque()
        self._thread: threading.Thread | None = None
        self._init_sync()
        _POOLS.add(self)
        if background:
            self._start_thread()

    def _init_sync(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def _start_thread(self) -> None:
        self._thread = threading.Thread(
            target=self._run,
            name=f"ursa-obfuscators-{self.public_key.fingerprint().hex()}",
            daemon=True,
        )
        self._thread.start()

    @property
    def capacity(self) -> int:
        """Most values the pool keeps ready."""
        return self._capacity

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)}/{self._capacity}"
        return f"ObfuscatorPool({self.public_key!r}, {state})"

    def __reduce__(self) -> str | tuple[Any, ...]:
        raise TypeError("ObfuscatorPool cannot be pickled: obfuscators never persist")

    def take(self) -> int:
        """Pop one obfuscator; compute one on the spot if the pool is empty.

        Raises:
            RuntimeError: the pool is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("ObfuscatorPool is closed")
            if self._background and self._thread is None:
                self._start_thread()  # first use in a forked child
            if self._values:
                value = self._values.popleft()
                self._changed.notify_all()
                return value
        return self.public_key.random_obfuscator()

    def fill(self, count: int | None = None) -> int:
        """Compute values in the calling thread, up to ``count`` or capacity.

        Returns:
            How many values were added.

        Raises:
            RuntimeError: the pool is closed.
        """
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if self._closed:
            raise RuntimeError("ObfuscatorPool is closed")
        wanted = self._capacity - len(self)
        if count is not None:
            wanted = min(wanted, count)
        added = 0
        for _ in range(wanted):
            value = self.public_key.random_obfuscator()
            if not self._add(value):
                break
            added += 1
        if self._closed:
            raise RuntimeError("ObfuscatorPool is closed")
        return added

    def wait_until(self, count: int, timeout_s: float) -> bool:
        """Block until the pool holds ``min(count, capacity)`` values or time runs out.

        Returns:
            Whether that many values are ready (False once closed).
        """
        target = min(count, self._capacity)
        with self._changed:
            self._changed.wait_for(
                lambda: self._closed or len(self._values) >= target, timeout_s
            )
            return not self._closed and len(self._values) >= target

    def close(self) -> None:
        """Stop the background thread and forget every unused value (idempotent)."""
        with self._changed:
            self._closed = True
            self._values.clear()
            self._changed.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def is_running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> ObfuscatorPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _add(self, value: int) -> bool:
        """Append one value if open and below capacity; False otherwise."""
        with self._changed:
            if self._closed or len(self._values) >= self._capacity:
                return False
            self._values.append(value)
            self._changed.notify_all()
            return True

    def _run(self) -> None:
        """Background loop: keep the pool full until closed."""
        gmpy2.get_context().allow_release_gil = True  # this thread's context only
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: self._closed or len(self._values) < self._capacity
                )
                if self._closed:
                    return
            self._add(self.public_key.random_obfuscator())

    def _forget_after_fork(self) -> None:
        """In a forked child: new locks, no values, thread restarted on first take."""
        self._init_sync()
        self._values = deque()
        self._thread = None


def _forget_all_after_fork() -> None:
    for pool in list(_POOLS):
        pool._forget_after_fork()


os.register_at_fork(after_in_child=_forget_all_after_fork)
