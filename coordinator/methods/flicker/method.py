"""FLICKER in the coordinator service: one run between enrolment and the first epoch.

Resampling changes the labels Dubhe's registry encodes, so the run comes
after enrolment (the ring needs the members' identity keys) and before the
first key epoch's registration. The service's BALANCING stage calls `step`
at every tick until the run is over (balanced, nobody left to correct, or
failed: the federation then trains on the data as it is), then opens the
first key epoch, whose `KeyEpochStart` tells the devices the run is over.

The runtime owns everything that is not the algorithm: admission, dedup
(the store's seen ids), refusals and their `ErrorReply`, the outbox, the one
MQTT session; it builds the method with its `MethodContext` (through the
method table, `ursa.coordinator.methods.registry`), and the method registers
FLICKER's kinds on the service's `Router`, answers the chunk requests of the
CKKS public context, hands each message to the run (`FlickerSession`) and
keeps the run in the store in the transaction of the message that changed
it: the correction loop in ``method_state('flicker', 'run')``, ``Enc(GD)``
under ``'encrypted_counts'`` (written only when it changes) and the ring's
`Relay` record in the ``phases`` table. The CKKS key lives in
``<state_dir>/ckks.key`` (0600, `ursa.coordinator.methods.flicker.keyfile`),
so after ``kill -9`` a restarted coordinator restores the run (`restore`,
once the store is open) and re-sends
what it waits on; the devices answer with the same message ids and cached
replies, so nothing is counted twice. The run's deadlines are live phases:
a broker outage extends them (`extend_deadlines`).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence, Set
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.coordinator.methods.flicker.keyfile import load_or_create_key_owner
from ursa.coordinator.methods.flicker.outcome import (
    FlickerOutcome,
    FlickerPhase,
    FlickerServiceConfig,
)
from ursa.coordinator.methods.flicker.session import FlickerSession
from ursa.coordinator.methods_config import FlickerSpec
from ursa.crypto.ckks import CkksKeyOwner, require_tenseal
from ursa.protocol.messages import (
    BaseMessage,
    ChunkRequest,
    CosineReply,
    CountUpdate,
    RedundancyOffer,
    RedundancyReply,
    RingHop,
    RingResult,
)
from ursa.protocol.router import RejectedError, Router

__all__ = ["FlickerMethod"]

logger = logging.getLogger("ursa.coordinator.flicker")

RUN_KEY = "run"
COUNTS_KEY = "encrypted_counts"
RING_PHASE = "flicker.ring"
RING_STREAM = 0x464C4B
"""The ring order's generator stream under the federation's seed ("FLK")."""

_KINDS: tuple[type[BaseMessage], ...] = (
    RingHop,
    RingResult,
    CosineReply,
    CountUpdate,
    RedundancyOffer,
    RedundancyReply,
)


class FlickerMethod:
    """FLICKER's coordinator half, the federation's balancing method.

    Built with its context, as the runtime's other methods are; the store
    behind the context opens later (the service starts), so the saved run
    is read back by `restore`.

    Raises:
        BackendUnavailableError: TenSEAL is not installed (the ``ckks`` extra).
        CryptoError: the key file is unreadable or others may read it.
        ValueError: neither ``state_dir`` nor ``key_owner``.

    Args:
        spec: The federation's ``kind = "flicker"`` table.
        context: The runtime's surface (send, relay, sign, the clock, the
            store, the enrolled devices' keys and certificates, relayed in
            `RingStart` so each member can check them); its federation id is
            the run's.
        num_classes: Classes of the federation's registry.
        state_dir: Where the CKKS key file lives (``key_owner`` instead: a
            key of the caller's, e.g. a simulation's counting one).
        seed: The federation's seed: ring orders come from a generator of
            their own under it, so running FLICKER leaves the service's draws
            (agents, trims) as they are without it.
        rng: Ring orders (instead of ``seed``'s generator).
        key_owner: The CKKS key pair (instead of the key file).
    """

    name: ClassVar[str] = "flicker"

    def __init__(
        self,
        spec: FlickerSpec,
        context: MethodContext,
        *,
        num_classes: int,
        state_dir: Path | None = None,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
        key_owner: CkksKeyOwner | None = None,
    ) -> None:
        require_tenseal()  # at configuration, not when the first device enrols
        self.spec = spec
        self.config = FlickerServiceConfig(
            federation=context.federation,
            num_classes=num_classes,
            **spec.model_dump(exclude={"kind"}),
        )
        self._ctx = context
        self._session = FlickerSession(
            self.config,
            _key_owner(state_dir, key_owner),
            context,
            rng=rng if rng is not None else _ring_rng(seed),
        )
        self._saved_counts: bytes | None = None
        self._waiting_logged = False
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self.refused = 0
        """Messages of the run refused so far (the runtime replied to each)."""

    # --- wiring -----------------------------------------------------------------

    def register(self, router: Router) -> None:
        """Route FLICKER's device messages here (a kind has one owner)."""
        for kind in _KINDS:
            router.register(kind, self._on_message, owner=self.name)

    def restore(self) -> None:
        """Read a saved run back from the store (the service started: it is open).

        An unreadable record is logged and a new run starts.
        """
        session, store = self._session, self._ctx.store
        record = store.method_state(self.name, RUN_KEY)
        if record is None:
            return
        try:
            raw_counts = store.method_state(self.name, COUNTS_KEY)
            counts = None if raw_counts is None else base64.b64decode(raw_counts)
            ring = store.phase(RING_PHASE)
            session.restore({**record, "ring": ring}, counts)
            self._saved_counts = counts
        except (KeyError, TypeError, ValueError) as exc:
            logger.error("FLICKER: the saved run is unreadable (%s); a new run", exc)
            return
        logger.info("FLICKER: resumed a run in phase %s", session.phase)

    def resume(self) -> None:
        """After a restart: re-send what the restored run waits on."""
        self._session.resume()

    @property
    def session(self) -> FlickerSession:
        """The run: its phase, outcome, context size."""
        return self._session

    # --- the stage --------------------------------------------------------------

    @property
    def is_over(self) -> bool:
        """Whether the run ended (balanced, saturated, capped, or failed)."""
        return self._session.phase in (FlickerPhase.DONE, FlickerPhase.FAILED)

    def step(self, now: float, online: Set[str]) -> bool:
        """Start the run over the online devices, or act on deadlines; True: over.

        A ring needs `MIN_RING_DEVICES` online devices; until then it waits.
        """
        session = self._session
        if session.phase is FlickerPhase.IDLE:
            if len(online) < fl.MIN_RING_DEVICES:
                if not self._waiting_logged:  # expected: the fleet comes online
                    logger.info(
                        "FLICKER waits for %d online devices (%d now)",
                        fl.MIN_RING_DEVICES,
                        len(online),
                    )
                    self._waiting_logged = True
                return False
            self.start(fl.choose_ring_order(sorted(online), session.rng), now)
        else:
            session.tick()
        self._save()
        if self.is_over and self._ended_at is None:
            self._ended_at = now
            logger.info("FLICKER over: %s", self.summary())
        return self.is_over

    def start(self, order: Sequence[str], now: float) -> str:
        """Start the run over ``order`` (a ring of enrolled devices); its id.

        `step` starts it over the online devices; a simulation names the
        order itself.

        Raises:
            FlickerError: a run is in progress, or a bad order.
        """
        run_id = self._session.start(order, round_index=0)
        self._started_at = now
        self._save()
        return run_id

    def extend_deadlines(self, seconds: float) -> None:
        """A broker outage: the run's open deadlines move ``seconds`` later."""
        self._session.extend_deadlines(seconds)

    def device_left(self, device: str) -> None:
        """A last will: a ring member that has not added its counts is skipped now."""
        session = self._session
        if session.phase is FlickerPhase.RING:
            session.device_left(device)
            self._save()

    def answers(self, request: ChunkRequest) -> bool:
        """Answer a chunk request for the CKKS context; False: not ours (a model)."""
        session = self._session
        if not session.is_context_request(request):
            return False
        try:
            session.on_message(request)
        except RejectedError:
            self.refused += 1
            raise
        return True

    # --- figures ----------------------------------------------------------------

    def outcome(self) -> FlickerOutcome:
        """The run so far."""
        return self._session.outcome()

    def summary(self) -> dict[str, Any]:
        """The run's figures: GI before and after, who resampled, and more.

        Also the global counts (the coordinator learns them by design), the
        refusals and this process's wall time of the run.
        """
        outcome = self.outcome()
        started, ended = self._started_at, self._ended_at
        before, state = outcome.gd_before, outcome.state
        resampled = sorted(
            {
                str(entry["device"])
                for entry in outcome.log
                if entry.get("update") and entry.get("device")
            }
        )
        return {
            "phase": str(outcome.phase),
            "gi_before": None if before is None else fl.global_imbalance(before),
            "gi_after": None if state is None else state.gi,
            "stop_reason": None
            if state is None or state.stop_reason is None
            else str(state.stop_reason),
            "resampled_devices": resampled,
            "failure": outcome.failure,
            "nabla": self.spec.nabla,
            "global_counts_before": None if before is None else list(before),
            "global_counts_after": None if state is None else list(state.global_counts),
            "rejections": self.refused,
            "wall_s": 0.0 if started is None else (ended or started) - started,
        }

    # --- plumbing -----------------------------------------------------------------

    def _on_message(self, message: BaseMessage) -> None:
        """A router handler: the runtime admitted it (inside its transaction).

        A refused message may still have changed the run (a bad ring result
        fails it), so the run is saved either way.
        """
        try:
            self._session.on_message(message)
        except RejectedError:
            self.refused += 1
            raise
        finally:
            self._save()

    def _save(self) -> None:
        session, store = self._session, self._ctx.store
        record = session.to_record()
        ring = record.pop("ring")
        store.set_method_state(self.name, RUN_KEY, record)
        if ring is not None:  # the run's id and order, open or closed
            store.save_phase(RING_PHASE, 0, ring)
        counts = session.encrypted_counts
        if counts is not None and counts is not self._saved_counts:
            encoded = base64.b64encode(counts).decode("ascii")
            store.set_method_state(self.name, COUNTS_KEY, encoded)
            self._saved_counts = counts


def _key_owner(state_dir: Path | None, key_owner: CkksKeyOwner | None) -> CkksKeyOwner:
    """The key given, else the state dir's file (loaded, or created on first use)."""
    if key_owner is not None:
        return key_owner
    if state_dir is None:
        raise ValueError("FLICKER needs a state_dir for its key, or a key_owner")
    return load_or_create_key_owner(state_dir)


def _ring_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(None if seed is None else [seed, RING_STREAM])
