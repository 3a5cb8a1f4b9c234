"""The party bound: most reports one encrypted sum adds, on both sides alike.

A packed Paillier slot must hold the sum of every report without carrying into
the next, so its width is ``log2(max_value * max_parties)`` plus a guard bit
(`ursa.crypto.encoding.PackingLayout`). The coordinator's key epoch (its
registry), and every encrypted mean's codec on the devices and the blind sum
on the coordinator, size their slots by the same bound; were the two sides to
differ, a sum would be refused or decode wrong. Devices past it are left out of
a key epoch. It costs log2 of itself in bits per slot (18 at 100,000): the
default registry (56 slots) is one 2048-bit ciphertext up to far beyond a
million devices.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_PARTIES"]

DEFAULT_MAX_PARTIES = 100_000
"""The default bound of every encrypted sum's parties (a config may set another)."""
