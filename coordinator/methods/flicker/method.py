"""FLICKER in the coordinator service: one run between enrolment and the first epoch.

Resampling changes the labels Dubhe's registry encodes, so the run comes
after enrolment (the ring needs the members' identity keys) and before the
first key epoch's registration. The service's BALANCING stage calls `step`
at every tick until the run is over (balanced, nobody left to correct, or
failed: the federation then trains on the data as it is), then opens the
first key epoch, whose `KeyEpochStart` tells the devices the run is over.

The runtime owns everything that is not the algorithm: admission, dedup
(the store's seen ids), the outbox, the one MQTT session. `FlickerMethod`
registers FLICKER's kinds on the service's `Router`, answers the chunk
requests of the CKKS public context, and keeps the run in the store in the
transaction of the message that changed it: the correction loop in
``method_state('flicker', 'run')``, ``Enc(GD)`` under ``'encrypted_counts'``
(written only when it changes) and the ring's `Relay` record in the
``phases`` table. The CKKS key lives in ``<state_dir>/ckks.key`` (0600,
`ursa.coordinator.methods.flicker.keyfile`), so after ``kill -9`` a
restarted coordinator restores the run and re-sends what it waits on; the
devices answer with the same message ids and cached replies, so nothing is
counted twice.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping, Set
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.coordinator.methods.flicker.engine import FlickerCoordinator
from ursa.coordinator.methods.flicker.keyfile import load_or_create_key_owner
from ursa.coordinator.methods.flicker.outcome import (
    FlickerOutcome,
    FlickerServiceConfig,
    Phase,
)
from ursa.coordinator.methods.flicker.wire import Sign
from ursa.coordinator.methods_config import FlickerSpec
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.ckks import require_tenseal
from ursa.crypto.identity import DevicePublicIdentity
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
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import Router

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
    """FLICKER's coordinator half inside `CoordinatorService`.

    Raises:
        BackendUnavailableError: TenSEAL is not installed (the ``ckks`` extra).

    Args:
        spec: The federation's ``kind = "flicker"`` table.
        rng: Ring order (the service's generator by default).
    """

    name: ClassVar[str] = "flicker"

    def __init__(self, spec: FlickerSpec, *, rng: np.random.Generator | None = None):
        require_tenseal()  # at configuration, not when the first device enrols
        self.spec = spec
        self._rng = rng
        self._engine: FlickerCoordinator | None = None
        self._store: CoordinatorStore | None = None
        self._saved_counts: bytes | None = None
        self._waiting_logged = False
        self._clock: Callable[[], float] | None = None
        self._started_at: float | None = None
        self._ended_at: float | None = None

    # --- wiring -----------------------------------------------------------------

    def register(self, router: Router) -> None:
        """Route FLICKER's device messages here (a kind has one owner)."""
        for kind in _KINDS:
            router.register(kind, self._on_message, owner=self.name)

    def attach(
        self,
        *,
        federation: str,
        run: str = "",
        num_classes: int,
        state_dir: Path,
        devices: Mapping[str, DevicePublicIdentity],
        store: CoordinatorStore,
        outbox: Outbox,
        clock: Callable[[], float],
        sign: Sign,
        seed: int | None = None,
        certificates: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or create) the CKKS key and restore a saved run.

        ``devices`` is the service's live enrolment table, ``certificates``
        its devices' operator certificates (relayed in `RingStart` with the
        members' keys, so each member can check them); replies go into the
        service's ``outbox``, which it flushes. The ring order comes from a
        generator of its own (from ``seed``), so running FLICKER leaves the
        service's draws (agents, trims) as they are without it.

        Raises:
            CryptoError: the key file is unreadable or others may read it.
        """
        config = FlickerServiceConfig(
            federation=federation,
            run=run,
            num_classes=num_classes,
            **self.spec.model_dump(exclude={"kind"}),
        )
        engine = FlickerCoordinator(
            config,
            devices,
            None,
            clock=clock,
            rng=self._rng if self._rng is not None else _ring_rng(seed),
            key_owner=load_or_create_key_owner(state_dir),
            outbox=outbox,
            sign=sign,
            certificates=certificates,
        )
        self._engine, self._store, self._clock = engine, store, clock
        record = store.method_state(self.name, RUN_KEY)
        if record is None:
            return
        try:
            raw_counts = store.method_state(self.name, COUNTS_KEY)
            counts = None if raw_counts is None else base64.b64decode(raw_counts)
            ring = store.phase(RING_PHASE)
            engine.restore({**record, "ring": ring}, counts)
            self._saved_counts = counts
        except (KeyError, TypeError, ValueError) as exc:
            logger.error("FLICKER: the saved run is unreadable (%s); a new run", exc)
            return
        logger.info("FLICKER: resumed a run in phase %s", engine.phase)

    def resume(self) -> None:
        """After a restart: re-send what the restored run waits on."""
        self._require().resume()

    # --- the stage --------------------------------------------------------------

    @property
    def is_over(self) -> bool:
        """Whether the run ended (balanced, saturated, capped, or failed)."""
        engine = self._engine
        return engine is not None and engine.phase in (Phase.DONE, Phase.FAILED)

    def step(self, now: float, online: Set[str]) -> bool:
        """Start the run over the online devices, or act on deadlines; True: over.

        A ring needs `MIN_RING_DEVICES` online devices; until then it waits.
        """
        engine = self._require()
        if engine.phase is Phase.IDLE:
            if len(online) < fl.MIN_RING_DEVICES:
                if not self._waiting_logged:  # expected: the fleet comes online
                    logger.info(
                        "FLICKER waits for %d online devices (%d now)",
                        fl.MIN_RING_DEVICES,
                        len(online),
                    )
                    self._waiting_logged = True
                return False
            order = fl.choose_ring_order(sorted(online), engine.rng)
            engine.start(order, round_index=0)
            self._started_at = now
        else:
            engine.tick()
        self._save()
        if self.is_over and self._ended_at is None:
            self._ended_at = now
            logger.info("FLICKER over: %s", self.summary())
        return self.is_over

    def device_left(self, device: str) -> None:
        """A last will: a ring member that has not added its counts is skipped now."""
        engine = self._engine
        if engine is not None and engine.phase is Phase.RING:
            engine.device_left(device)
            self._save()

    def answers(self, request: ChunkRequest) -> bool:
        """Answer a chunk request for the CKKS context; False: not ours (a model)."""
        engine = self._require()
        if not engine.is_context_request(request):
            return False
        engine.on_message(request.sender, request, admitted=True)
        return True

    # --- figures ----------------------------------------------------------------

    def outcome(self) -> FlickerOutcome | None:
        """The run so far (None before `attach`)."""
        return None if self._engine is None else self._engine.outcome()

    def summary(self) -> dict[str, Any]:
        """The run's figures: GI before and after, who resampled, and more.

        Also the global counts (the coordinator learns them by design), the
        refusals and this process's wall time of the run.
        """
        outcome = self.outcome()
        engine = self._engine
        started, ended = self._started_at, self._ended_at
        before = None if outcome is None else outcome.gd_before
        state = None if outcome is None else outcome.state
        resampled = sorted(
            {
                str(entry["device"])
                for entry in (outcome.log if outcome is not None else ())
                if entry.get("update") and entry.get("device")
            }
        )
        return {
            "phase": None if outcome is None else str(outcome.phase),
            "gi_before": None if before is None else fl.global_imbalance(before),
            "gi_after": None if state is None else state.gi,
            "stop_reason": None
            if state is None or state.stop_reason is None
            else str(state.stop_reason),
            "resampled_devices": resampled,
            "failure": None if outcome is None else outcome.failure,
            "nabla": self.spec.nabla,
            "global_counts_before": None if before is None else list(before),
            "global_counts_after": None if state is None else list(state.global_counts),
            "rejections": 0 if engine is None else len(engine.rejections),
            "wall_s": 0.0 if started is None else (ended or started) - started,
        }

    # --- plumbing -----------------------------------------------------------------

    def _on_message(self, message: BaseMessage) -> None:
        """A router handler: the runtime admitted it (inside its transaction)."""
        self._require().on_message(message.sender, message, admitted=True)
        self._save()

    def _save(self) -> None:
        engine, store = self._require(), self._store
        if store is None:  # unreachable: set with the engine
            return
        record = engine.to_record()
        ring = record.pop("ring")
        store.set_method_state(self.name, RUN_KEY, record)
        if ring is not None:  # the run's id and order, open or closed
            store.save_phase(RING_PHASE, 0, ring)
        counts = engine.encrypted_counts
        if counts is not None and counts is not self._saved_counts:
            encoded = base64.b64encode(counts).decode("ascii")
            store.set_method_state(self.name, COUNTS_KEY, encoded)
            self._saved_counts = counts

    def _require(self) -> FlickerCoordinator:
        if self._engine is None:
            raise RuntimeError("FlickerMethod.attach() was not called")
        return self._engine


def _ring_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(None if seed is None else [seed, RING_STREAM])
