"""State the key epoch's stages still share with the service (being taken apart).

`ServiceCore` holds what the key epoch and the service both read: the
config, the clock, the generator, the store, the enrolled and online
devices (`EnrolledDevices`, `Presence`), the working copy of the current key
epoch and who its rounds draw from (`EpochSets`), the sit-outs, and the
refusal path. The `RoundState` is the `StageMachine`'s, the current round
the `RoundCycle`'s, and everything sent goes through `SigningPoint` (the one
signing point) into the outbox, which the service flushes after releasing
its lock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Set
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.device_sets import IndexedDevices, OnlineDevices
from ursa.coordinator.ending import Ending
from ursa.coordinator.enrolled_devices import REFUSING_KEY, EnrolledDevices
from ursa.coordinator.identity_refusals import IdentityRefusals
from ursa.coordinator.plugin import EpochView, RoundPlugin
from ursa.coordinator.presence import Presence
from ursa.coordinator.refusal_log import RefusalLog, Stored
from ursa.coordinator.registry_check import RegistryChecking
from ursa.coordinator.rounds import RoundState
from ursa.coordinator.seal_pages import SealPaging
from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import STATE_KEY, StageMachine
from ursa.coordinator.store import CoordinatorStore
from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.paillier import EncryptedVector, PaillierPublicKey
from ursa.protocol.messages import COORDINATOR, BaseMessage, ErrorReply
from ursa.protocol.outbox import Outbox
from ursa.protocol.transport import Transport

__all__ = [
    "REFUSING_KEY",
    "STATE_KEY",
    "EpochSets",
    "EpochWork",
    "RoundWork",
    "ServiceCore",
]

logger = logging.getLogger("ursa.coordinator")

_M = TypeVar("_M", bound=BaseMessage)

SAT_OUT_KEY = "sat_out"
"""Store meta key: JSON ``{device: key epoch}`` of the devices that sat out."""


@dataclass
class EpochWork:
    """The current key epoch, as the coordinator works on it."""

    epoch: int
    agent: str
    recipients: tuple[str, ...]
    notice: bytes
    public_key: PaillierPublicKey | None = None
    public_key_msg: bytes | None = None
    running_sum: EncryptedVector | None = None
    registered: set[str] = field(default_factory=set)
    registry_sum_msg: bytes | None = None
    sealing: SealPaging | None = None
    """The agent's sealing, page by page (`ursa.coordinator.seal_pages`)."""
    sealed_at: float = float("-inf")
    """When a page was last sent or completed (a stalled agent is asked again)."""
    pending: set[str] | None = None
    """Online recipients not yet registered nor sitting out; built when
    registration opens, shrunk on each registration, departure and sit-out."""
    check: RegistryChecking | None = None
    """The agent's one-hot check of the registrations (registration closed)."""
    members: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.members = frozenset(self.recipients)

    def left(self, device: str) -> None:
        """`device` went offline or sits out: registration no longer waits for it."""
        if self.pending is not None:
            self.pending.discard(device)


@dataclass
class EpochSets:
    """Who a key epoch's rounds draw from, kept per device event (O(1) each).

    Built once per key epoch (or restart), then updated on every presence,
    enrolment, refusal, sit-out and registration change, so opening a round
    and topping it up never pass over the fleet.
    """

    work: EpochWork
    eligible: IndexedDevices
    """Registered in the epoch and in the online view (who a top-up draws)."""
    members_online: set[str]
    """The epoch's recipients (its starting fleet) that are online: churn."""


@dataclass
class RoundWork:
    """The current round, as the coordinator works on it."""

    round: int
    epoch: int
    announce: bytes
    selected: tuple[str, ...] | None = None
    result: bytes | None = None


class ServiceCore:
    """State and helpers shared by the coordinator's stages."""

    _config: CoordinatorConfig
    _clock: Clock
    _rng: np.random.Generator
    _plugin: RoundPlugin
    _selection: SelectionMethod
    _transport: Transport | None
    _store: CoordinatorStore
    _identity: DeviceIdentity
    _stages: StageMachine
    _devices: EnrolledDevices
    _enrolled: dict[str, DevicePublicIdentity]
    """``_devices.identities``: the enrolled devices' identity keys."""
    _certificates: dict[str, bytes]
    """Enrolled devices' operator certificates, relayed with their keys."""
    _presence: Presence
    _online: set[str]
    """``_presence.online``: who the coordinator counts as online."""
    _epoch: EpochWork | None
    _refusing: set[str]
    """Enrolled devices that refused this coordinator's identity (not counted)."""
    _identity_refusals: IdentityRefusals
    """Which refusals of our identity count, and the re-keys each device caused."""
    _ready: set[str]
    """Online, enrolled and not refusing: kept per device (`_device_changed`)."""
    _online_view: OnlineDevices
    """`_ready` without the devices sitting the key epoch out (read-only)."""
    _sat_out: dict[str, int]
    """Devices that sat a key epoch out (`method_mismatch`, `data_mismatch`): epoch."""
    _announced_at: float = float("-inf")
    """When the open round was last re-announced (rate limit)."""
    _outbox: Outbox
    _outgoing: SigningPoint
    """The one signing point: stamps, signs and queues what is sent."""
    _ending: Ending
    """When the federation ends, and its `FederationEnd` and final model."""
    _telemetry: Telemetry
    _refusals: RefusalLog
    """Refusal lines and stored errors, within per-device limits."""
    _epoch_sets_cache: EpochSets | None = None
    """`_epoch_sets`' current value (None: build it at the next call)."""

    # --- state --------------------------------------------------------------

    @property
    def _state(self) -> RoundState:
        """``_stages.state``: the current stage, epoch, round and deadline."""
        return self._stages.state

    def _epoch_view(self) -> EpochView | None:
        """The current key epoch's public data (for methods and plugins)."""
        work = self._epoch
        if work is None:
            return None
        return EpochView(
            work.epoch,
            work.public_key,
            work.registered,  # live and read-only: a copy per call is O(N)
            work.agent,
            self._enrolled.get(work.agent),
        )

    def _online_enrolled(self) -> Set[str]:
        """Online enrolled devices not refusing us (maintained: O(1) to get)."""
        return self._ready

    def _device_changed(self, device: str) -> None:
        """Bring `device`'s membership of `_ready` up to date (O(1))."""
        self._online_view.touch(device)
        if (
            device in self._online
            and device in self._enrolled
            and device not in self._refusing
        ):
            self._ready.add(device)
        else:
            self._ready.discard(device)
        self._epoch_device_changed(device)

    def _rebuild_ready(self) -> None:
        """Recompute `_ready` from scratch (start-up and restore only: O(N))."""
        self._ready.clear()  # in place: `_online_view` shares it
        self._ready.update(
            d for d in self._online if d in self._enrolled and d not in self._refusing
        )
        self._online_view.forget()
        self._epoch_sets_cache = None

    def _epoch_sets(self) -> EpochSets | None:
        """The current key epoch's `EpochSets` (None without an epoch).

        Built on the first call after a new key epoch or a restore: O(N) once
        per epoch, sorted by id so the order does not depend on string
        hashing. Kept per event afterwards (`_epoch_device_changed`).
        """
        work = self._epoch
        if work is None:
            return None
        sets = self._epoch_sets_cache
        if sets is None or sets.work is not work:
            online, view = self._online, self._online_view
            sets = EpochSets(
                work,
                IndexedDevices(sorted(d for d in work.registered if d in view)),
                {d for d in work.members if d in online},
            )
            self._epoch_sets_cache = sets
        return sets

    def _epoch_device_changed(self, device: str) -> None:
        """Bring `device`'s membership of the `EpochSets` up to date (O(1)).

        For a presence, enrolment, refusal or sit-out change, and for a
        registration in the current key epoch.
        """
        sets = self._epoch_sets_cache
        if sets is None or sets.work is not self._epoch:
            return  # built from scratch at the next `_epoch_sets`
        work = sets.work
        if device in work.registered and device in self._online_view:
            sets.eligible.add(device)
        else:
            sets.eligible.discard(device)
        if device in work.members and device in self._online:
            sets.members_online.add(device)
        else:
            sets.members_online.discard(device)

    def _sitting_out(self) -> set[str]:
        """Devices that told us they sit the current key epoch out."""
        epoch = self._state.epoch
        return {device for device, e in self._sat_out.items() if e == epoch}

    def _sit_out(self, device: str) -> None:
        """Leave `device` out of the current key epoch (persisted for a restart)."""
        self._sat_out[device] = self._state.epoch
        self._online_view.touch(device)
        self._store.set_meta(SAT_OUT_KEY, json.dumps(self._sat_out))
        if self._epoch is not None:
            self._epoch.left(device)
        self._epoch_device_changed(device)

    # --- sending ------------------------------------------------------------

    def _reject(
        self,
        device: str | None,
        what: str,
        code: str,
        reason: str,
        in_reply_to: str | None,
        counted: bool = False,
    ) -> None:
        """Log (and keep, for status) a refused message; tell the sender, if known.

        The line and the stored error are within the sender's refusal limits
        (`RefusalLog`), its text escaped. ``counted``: the telemetry already
        counted it (an admission drop).
        """
        if not counted:
            self._telemetry.rejected(code)
        self._refusals.write(
            self._clock(),
            device,
            logging.WARNING,
            "rejected %s from %s: %s: %s",
            what,
            device,
            code,
            reason,
            kind=code,
            stored=Stored(what, code, reason),
        )
        if device is None:
            return
        reply = ErrorReply(
            federation=self._config.federation,
            round=self._state.round,
            sender=COORDINATOR,
            code=code,
            reason=reason[:256],
            in_reply_to=in_reply_to,
        )
        self._outgoing.send(reply, device)
