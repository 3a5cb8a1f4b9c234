"""torch's default generator, seeded for one piece of work at a time.

torch keeps one default generator per process. Seeding it for a block
(`torch.random.fork_rng` + `torch.manual_seed`) is only deterministic while no
other thread seeds it meanwhile, and two threads doing so at once can deadlock
torch's lazy per-device seeding (seen with four devices in one process each
checking a downloaded model). `torch_seeded` makes such blocks take turns in
a process: a device app running several devices in threads trains them one
after another, each as reproducibly as alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["TORCH_RNG_LOCK", "torch_seeded"]

TORCH_RNG_LOCK = threading.RLock()
"""Held while a block runs on torch's seeded default generator (re-entrant)."""


@contextlib.contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """Run the block on torch's default generator seeded with ``seed`` (restored)."""
    import torch

    with TORCH_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
