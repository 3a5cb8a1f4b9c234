"""The device's current key epoch: its notice, agent, keys, registry slot and roster.

`KeyEpoch` (``key_epoch.py``) owns the one `KeyEpochView` and is the only
part that changes it; the training rounds, the methods' context and the
client are handed it as an `CurrentEpoch`, which has no way to change it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.edge_sdk.method import EpochKeys, Roster
from ursa.protocol.messages import KeyEpochStart
from ursa.protocol.router import NotReadyError

__all__ = ["CurrentEpoch", "KeyEpochView"]


class CurrentEpoch(Protocol):
    """The current key epoch as a part that only reads it sees it."""

    @property
    def notice(self) -> KeyEpochStart | None:
        """The adopted epoch's signed notice (None before any)."""
        ...

    @property
    def agent(self) -> DevicePublicIdentity | None:
        """The epoch's agent (it made the key pair)."""
        ...

    @property
    def public_key(self) -> PaillierPublicKey | None:
        """The epoch's public key, once the agent's signed copy is here."""
        ...

    @property
    def secret_key(self) -> PaillierSecretKey | None:
        """The epoch's secret key, once made (agent) or opened (the others)."""
        ...

    @property
    def index(self) -> int | None:
        """This device's registry slot (None: it sits out or has not adopted)."""
        ...

    @property
    def registry(self) -> NDArray[np.int64] | None:
        """The decrypted overall registry (devices per slot)."""
        ...

    @property
    def sits_out(self) -> bool:
        """Whether the device sits the epoch out (its data or model does not fit)."""
        ...

    def require(self, epoch: int) -> KeyEpochStart:
        """The adopted epoch if it is ``epoch``; blocks on a newer, refuses older."""
        ...

    def current_keys(self) -> EpochKeys | None:
        """The epoch's keys, or None while its public key is missing."""
        ...

    def roster(self) -> Roster | None:
        """The epoch's decrypted registry (None until its sum is here)."""
        ...


class KeyEpochView:
    """The adopted key epoch and what the device learnt of it (see the module)."""

    def __init__(self) -> None:
        self.notice: KeyEpochStart | None = None
        self.payload = b""
        """The notice's bytes as received (persisted, re-decoded on restart)."""
        self.agent: DevicePublicIdentity | None = None
        self.public_key: PaillierPublicKey | None = None
        self.secret_key: PaillierSecretKey | None = None
        self.pool: ObfuscatorPool | None = None
        """Precomputed obfuscators under the public key (None: none)."""
        self.index: int | None = None
        self.registry: NDArray[np.int64] | None = None
        self.registered_epoch: int | None = None
        """The epoch this device sent its registration in."""
        self.sat_out_epoch: int | None = None
        """The epoch this device sits out because it does not fit (data_mismatch)."""

    def clear(self) -> None:
        """No epoch (a new run); the pool's worker stops."""
        self.adopt(None, b"", None)
        self.index = self.registered_epoch = self.sat_out_epoch = None

    def adopt(
        self,
        notice: KeyEpochStart | None,
        payload: bytes,
        agent: DevicePublicIdentity | None,
    ) -> None:
        """A new epoch: the old one's keys, pool and registry go."""
        if self.pool is not None:
            self.pool.close()
        self.notice, self.payload, self.agent = notice, payload, agent
        self.public_key = self.secret_key = self.pool = None
        self.registry = None

    @property
    def sits_out(self) -> bool:
        """Whether the device sits the current epoch out (its data does not fit)."""
        notice = self.notice
        return notice is not None and self.sat_out_epoch == notice.epoch

    def require(self, epoch: int) -> KeyEpochStart:
        """The adopted epoch if it is ``epoch``; blocks on a newer, refuses older."""
        current = self.notice
        if current is None or epoch > current.epoch:
            raise NotReadyError
        if epoch < current.epoch:
            raise ValueError(f"key epoch {epoch} is over (current {current.epoch})")
        return current

    def current_keys(self) -> EpochKeys | None:
        """The epoch's keys, or None while its public key is missing."""
        if self.notice is None or self.public_key is None:
            return None
        return EpochKeys(self.notice, self.public_key, self.secret_key, self.pool)

    def roster(self) -> Roster | None:
        """The epoch's decrypted registry (None until its sum is here)."""
        if self.notice is None or self.registry is None:
            return None
        return Roster(self.notice.epoch, self.index, self.registry)
