"""A round's running sum of masked vectors, checkpointed as one file.

Each masked vector alone is uniformly random to the coordinator, and so is
their sum until the survivors' shares remove the masks; the file names its
contributors, so a vector re-sent after a restart is not added twice.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = ["MaskedSum"]


@dataclass
class MaskedSum:
    """The running sum (mod 2^32) of a round's masked vectors, and whose they are.

    Each vector alone is uniformly random to the coordinator; the sum is too,
    until the survivors' shares remove the masks.
    """

    round: int
    version: int
    total: NDArray[np.uint32]
    contributors: set[str] = field(default_factory=set)

    def to_bytes(self) -> bytes:
        """The checkpoint file's content."""
        meta = {
            "round": self.round,
            "version": self.version,
            "contributors": sorted(self.contributors),
        }
        buffer = io.BytesIO()
        np.savez(buffer, total=self.total, meta=np.array(json.dumps(meta)))
        return buffer.getvalue()

    @classmethod
    def from_file(cls, path: Path) -> MaskedSum:
        """A checkpoint back (raises OSError, ValueError or KeyError if damaged)."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            total = np.array(data["total"], dtype=np.uint32)
        return cls(
            int(meta["round"]),
            int(meta["version"]),
            total,
            {str(d) for d in meta["contributors"]},
        )
