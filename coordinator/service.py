"""The coordinator service: the lifecycle of one coordinator's components.

Enrolment, a key epoch, then rounds until `FederationEnd` (docs/protocol.md);
its parts are built and wired in `ursa.coordinator.components` (the inbox,
the key epoch, the round cycle, the broker link, the restart, ...); the
service opens the store behind the methods' context (`Components.context`) and
runs `start`, `tick` and `stop` under one lock.

Nothing a device sends can crash it: an unexpected exception is logged and
its transaction rolls back (not marked seen: a re-send is handled afresh).
State lives in SQLite (`ursa.coordinator.store`, committed in batches; the
outbox publishes nothing a crash takes back); a restart reloads it and
re-publishes what the stage waits on (`recovery`), and devices answer
with the same message ids, so nothing is counted twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence, Set

import numpy as np

from ursa.coordinator.balancing import Balancing
from ursa.coordinator.before_training import StepBuilder
from ursa.coordinator.clock import Clock
from ursa.coordinator.components import Components
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.federation_end import FinalOutput
from ursa.coordinator.key_epoch import KeyEpoch
from ursa.coordinator.own_identity import IDENTITY_PUBLIC_FILENAME
from ursa.coordinator.plugin import NoTraining, PluginBuilder, RoundPlugin
from ursa.coordinator.retained_sweep import RETAINED_SWEEP_S
from ursa.coordinator.round_state import RoundState, Stage
from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.site_links import SiteLink
from ursa.coordinator.stage_machine import STATE_KEY
from ursa.coordinator.startup_hold import MAX_HELD
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.identity import DevicePublicIdentity
from ursa.protocol.admission_limits import AdmissionStats
from ursa.protocol.transport import Transport, TransportStats

__all__ = [
    "IDENTITY_PUBLIC_FILENAME",
    "MAX_HELD",
    "RETAINED_SWEEP_S",
    "CoordinatorService",
]

logger = logging.getLogger("ursa.coordinator")


class CoordinatorService:
    """The coordinator: one instance per federation, driven by `run` or `tick`.

    Args:
        config: The frozen service configuration.
        transport: A transport to use (tests: in-memory); None builds an
            `MqttTransport` from ``config.broker`` with a retained last will.
        clock: Seconds, for deadlines (tests inject a fake one).
        plugin: Builds the training phase with its context (`PluginContext`);
            without one, `NoTraining` completes rounds at once.
        steps: The methods' before-training steps (CLIMB's dual step, the
            federated evaluation), run by the round cycle before the plugin
            trains.
        rng: The generator for agent choice and trim/top-up.
        final_output: The model's architecture (for the final model card)
            and an ONNX exporter; without it: weights and a card only.
        telemetry: Where the service reports what it does (`Telemetry`; one
            is made when None), for ``/metrics`` and the dashboard.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        transport: Transport | None = None,
        clock: Clock = time.time,
        plugin: PluginBuilder | None = None,
        steps: Sequence[StepBuilder] = (),
        rng: np.random.Generator | None = None,
        final_output: FinalOutput | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._started = self._resumed = False
        self._parts = Components(
            config,
            transport=transport,
            clock=clock,
            build_plugin=plugin or (lambda _ctx: NoTraining()),
            steps=steps,
            rng=rng if rng is not None else np.random.default_rng(config.seed),
            final_output=final_output,
            telemetry=telemetry or Telemetry(),
            keep_error=lambda *error: self.store.record_error(*error),
        )

    @property
    def state(self) -> RoundState:
        """The current stage, epoch, round and deadline."""
        return self._parts.stages.state

    @property
    def config(self) -> CoordinatorConfig:
        """The configuration."""
        return self._config

    @property
    def federation(self) -> str:
        """The federation id."""
        return self._config.federation

    @property
    def identity(self) -> DevicePublicIdentity:
        """The coordinator's public signing identity (once started)."""
        return self._parts.identity.public

    @property
    def run_id(self) -> str:
        """This run's id, once started (`CoordinatorStore.run_id`)."""
        return self._parts.outgoing.run

    @property
    def store(self) -> CoordinatorStore:
        """The persistent store (once started; for inspection and tests)."""
        if not self._parts.store.is_open:
            raise AttributeError("the coordinator has not started: no store yet")
        return self._parts.store.store

    @property
    def is_done(self) -> bool:
        """True once the configured number of rounds is complete."""
        return self.state.stage is Stage.DONE

    @property
    def balancing(self) -> Balancing | None:
        """The balancing method (FLICKER), if the federation runs one (figures)."""
        return self._parts.balancing

    @property
    def telemetry(self) -> Telemetry:
        """What the service did so far (counts, stages, rounds, recent errors)."""
        return self._parts.telemetry

    @property
    def key_epoch(self) -> KeyEpoch:
        """The key epoch component (its view and sets; for status and tests)."""
        return self._parts.key_epoch

    @property
    def plugin(self) -> RoundPlugin:
        """The training plugin (for status and tests)."""
        return self._parts.plugin

    @property
    def selection(self) -> SelectionMethod:
        """The federation's selection method (for status and tests)."""
        return self._parts.selection

    @property
    def transport(self) -> Transport | None:
        """The broker link's transport (None before `start` built one)."""
        return self._parts.link.transport

    @property
    def transport_stats(self) -> TransportStats:
        """Messages and payload bytes through the broker link so far."""
        return self._parts.link.stats

    @property
    def is_connected(self) -> bool:
        """True while the broker link is up."""
        return self._parts.link.is_connected

    @property
    def site_links(self) -> dict[str, SiteLink]:
        """Every site bridge's last known state (read from any thread)."""
        return self._parts.outage.site_links

    @property
    def held_dropped(self) -> int:
        """Messages dropped because too many arrived before the stage was restored."""
        return self._parts.admission.held_dropped

    @property
    def retained_cleared(self) -> int:
        """Retained messages on device up topics cleared from the broker so far."""
        return self._parts.retained.cleared

    def run_drops(self) -> dict[str, int]:
        """Messages dropped per device because they belong to another run."""
        with self._lock:
            return self._parts.admission.run_drops()

    def admission_stats(self) -> AdmissionStats:
        """Messages admitted and dropped by the per-device limits, so far."""
        with self._lock:
            return self._parts.admission.stats()

    def device_identity(self, device: str) -> DevicePublicIdentity | None:
        """An enrolled device's identity keys (its peers verify it with them)."""
        return self._parts.devices.identities.get(device)

    def device_certificate(self, device: str) -> bytes:
        """An enrolled device's operator certificate (b"": none, tofu)."""
        return self._parts.devices.certificates.get(device, b"")

    def online_devices(self) -> Set[str]:
        """Enrolled devices online, not sitting the epoch out (a live view)."""
        return self._parts.key_epoch.online

    def reannounce(self) -> None:
        """Publish the open round's announce again (rate-limited; for methods)."""
        self._parts.rounds.reannounce()

    def start(self, *, stop: threading.Event | None = None) -> None:
        """Open the store, restore state, connect and resume the current stage.

        Without a transport given, a broker that is not up yet is waited for
        (`ursa.protocol.connect`) until it is, or until ``stop`` is set.
        """
        if self._started:
            raise RuntimeError("CoordinatorService.start() called twice")
        self._started = True
        cfg, parts = self._config, self._parts
        identity = parts.identity.load()
        store = parts.open_store(cfg.state_dir / DB_FILENAME, cfg.store.policy())
        parts.outbox.wait_for(store)  # publish nothing a crash takes back
        now = self._clock()
        fresh = store.get_meta(STATE_KEY) is None
        run = store.run_id()
        parts.outgoing.start(identity, run)
        logger.info("%s%s", cfg.summary(run), " (a new run)" if fresh else "")
        with self._lock:
            parts.recovery.restore(store, now)
        parts.link.connect(self.handle, self._on_retained, stop or self._stopped)
        if fresh:
            parts.retained.clear_notices()
        parts.link.publish_status(online=True)
        parts.outage.started(parts.link.is_connected)
        with self._lock:
            parts.recovery.resume(store, self._clock())
            self._resumed = True
            for topic, payload in parts.admission.take_held():  # came in the restore
                self._admit_safely(topic, payload, charged=True)
            parts.step(self._clock())
        parts.link.flush()

    def tick(self) -> None:
        """Check deadlines and phase conditions now (the run loop calls it)."""
        parts = self._parts
        with self._lock:
            try:
                gone = parts.outage.watch(parts.link.transport, self._clock())
                if gone:
                    with self.store.transaction():
                        parts.inbox.departed(gone)
                parts.key_epoch.revoked(parts.devices.revocations())
                parts.step(self._clock())
                parts.refusals.flush(self._clock())
                self.store.flush_if_due()  # a batch no message or publish closed
            except Exception:
                logger.exception("stage step failed; will retry at the next tick")
        parts.link.flush()
        parts.retained.sweep(parts.link.transport, self._clock())

    def run(
        self, stop: threading.Event | None = None, *, until_done: bool = True
    ) -> None:
        """Start, tick until stopped (or the rounds are done), then stop."""
        stop = stop or self._stopped
        if not self._started:
            self.start(stop=stop)
        try:
            while not stop.is_set() and not self._stopped.is_set():
                self.tick()
                if until_done and self.is_done:
                    break
                stop.wait(self._config.poll_interval_s)
        finally:
            self.stop()

    def stop(self) -> None:
        """Publish offline, close the transport and the store (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._parts.admission.report_unlogged()
        self._parts.link.close()
        if self._parts.store.is_open:
            self._parts.store.store.close()

    def handle(self, topic: str, payload: bytes) -> None:
        """The transport handler: admit, dispatch, step; never raises.

        Until `start` has restored and resumed the current stage, messages are
        held, not judged: an update queued in the broker during a restart must
        not be refused as late because its round is not reopened yet.
        """
        with self._lock:
            if not self._resumed:
                self._parts.admission.hold(topic, payload, self._clock())
                return
            self._admit_safely(topic, payload)
        self._parts.link.flush()

    def _on_retained(self, topic: str, payload: bytes) -> None:
        """A stored retained message: cleared if on a device's up topic.

        Everything else (statuses, bridge states) is handled as usual.
        """
        with self._lock:
            swept = self._parts.retained.on_retained(topic, payload, self._clock())
        if not swept:
            self.handle(topic, payload)
            return
        self._parts.link.flush()

    def _admit_safely(self, topic: str, payload: bytes, charged: bool = False) -> None:
        try:
            self._parts.inbox.admit(topic, payload, self._clock(), charged=charged)
        except Exception:
            logger.exception("internal error on a message from %s", topic)
