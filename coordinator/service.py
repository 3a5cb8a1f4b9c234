"""The coordinator service: wiring and lifecycle of its components.

The protocol as the coordinator runs it is in docs/protocol.md (Dubhe Fig.
3-5): enrolment, a key epoch (agent, sealed keys, registration), then rounds
(announce, the selection method's own messages, training), until the
configured rounds are done and `FederationEnd` is published.

The service builds its components, hands each its collaborators and runs
their lifecycle (`start`, `tick`, `run`, `stop`): the inbox (`inbox`:
admission, de-duplication, routing of every message), the enrolled devices
(`enrolled_devices`), the presence (`presence`), the run's `RoundState`
(`stage_machine`), the key epoch (`key_epoch`: enrolment, balancing, key
epoch and registration, and the one `EpochView` methods see), the rounds
(`round_cycle`), the end of the federation (`ending`), what it sends
(`signing_point`) and refuses (`rejections`), broker and site-link outages
(`broker_outage`: one loop extends every live phase), the retained sweep
(`retained_sweep`), the restart (`recovery`), and the context its methods are
lent (`method_context`). No component reads another's private state.

Nothing a device sends can crash it: an unexpected exception is logged with
its traceback and its transaction rolls back (the message is not marked
seen, so a re-send is handled afresh). Restart: state, epochs, rounds, the
methods' progress and seen ids live in SQLite (`ursa.coordinator.store`,
committed in batches; the outbox publishes nothing before the batch that
produced it is committed); on start the service reloads them and
re-publishes what the stage waits on (`recovery`). Devices answer
idempotently with the same message ids, so nothing is counted twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Set

import numpy as np

from ursa.coordinator.admission import Admission
from ursa.coordinator.broker_outage import BrokerOutage
from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.ending import Ending
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.federation_end import FinalOutput
from ursa.coordinator.identity_refusals import IdentityRefusals
from ursa.coordinator.inbox import Inbox
from ursa.coordinator.key_epoch import KeyEpoch
from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.registry import selection_method
from ursa.coordinator.plugin import EpochView, NoTraining, RoundPlugin, SignedT
from ursa.coordinator.presence import Presence
from ursa.coordinator.recovery import Recovery
from ursa.coordinator.refusal_log import RefusalLog
from ursa.coordinator.rejections import Rejections
from ursa.coordinator.retained_sweep import RETAINED_SWEEP_S, RetainedSweep
from ursa.coordinator.round_cycle import RoundCycle
from ursa.coordinator.rounds import RoundState, Stage
from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.site_links import SiteLink
from ursa.coordinator.stage_machine import STATE_KEY, StageFunctions, StageMachine
from ursa.coordinator.startup_hold import MAX_HELD
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.certificate import Role
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.secret_file import ensure_private_dir
from ursa.protocol.admission_limits import AdmissionStats
from ursa.protocol.connect import connect_patiently
from ursa.protocol.messages import COORDINATOR, BaseMessage, Status
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import Router
from ursa.protocol.topics import (
    BRIDGE_STATE_FILTER,
    STATUS,
    coordinator_subscriptions,
    global_topic,
)
from ursa.protocol.transport import Transport, TransportError, TransportStats

__all__ = [
    "IDENTITY_PUBLIC_FILENAME",
    "MAX_HELD",
    "RETAINED_SWEEP_S",
    "CoordinatorService",
]

logger = logging.getLogger("ursa.coordinator")

IDENTITY_PUBLIC_FILENAME = "coordinator.pub"
"""Hex of the coordinator's public identity, for devices that pin it by config."""


class CoordinatorService:
    """The coordinator: one instance per federation, driven by `run` or `tick`.

    Args:
        config: The frozen service configuration.
        transport: A transport to use (tests: in-memory); None builds an
            `MqttTransport` from ``config.broker`` with a retained last will.
        clock: Seconds, for deadlines (tests inject a fake one).
        plugin: The training phase; `NoTraining` completes rounds at once.
        rng: The generator for agent choice and trim/top-up.
        flicker: FLICKER's coordinator half; by default built from the
            config's ``kind = "flicker"`` table (BALANCING runs it between
            enrolment and the first key epoch).
        final_output: The model's architecture (for the final model card)
            and an ONNX exporter; without it the final model is written as
            weights and a card only.
        telemetry: Where the service reports what it does (`Telemetry`; one
            is made when None), for ``/metrics`` and the dashboard.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        transport: Transport | None = None,
        clock: Clock = time.time,
        plugin: RoundPlugin | None = None,
        rng: np.random.Generator | None = None,
        flicker: FlickerMethod | None = None,
        final_output: FinalOutput | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._config = config
        self._telemetry = telemetry or Telemetry()
        self._telemetry.set_methods(m.kind for m in config.methods)
        self._telemetry.set_traffic(self._traffic)
        self._clock = clock
        self._plugin = plugin or NoTraining()
        training = config.training_method()
        runs = self._plugin.methods()
        if runs != ((training.kind,) if training is not None else ()):
            named = training.kind if training is not None else "no training method"
            raise ValueError(
                f"[[methods]] names {named}, the training plugin runs "
                f"{', '.join(runs) or 'none'}"
            )
        spec = config.flicker_method()
        if flicker is None and spec is not None:
            flicker = FlickerMethod(spec)
        if flicker is not None and spec is None:
            raise ValueError("a FLICKER method, but [[methods]] names no flicker")
        self._flicker = flicker
        self._selection = selection_method(config)
        rng = rng if rng is not None else np.random.default_rng(config.seed)
        self._transport = transport
        self._lock = threading.RLock()
        self._outbox = Outbox("coordinator")
        self._stopped = threading.Event()
        self._started = self._resumed = False
        self._stages = stages = StageMachine(self._telemetry)
        self._trust = config.trust.anchor(config.federation, COORDINATOR)
        self._certificate = b""
        """The coordinator's own operator certificate (b"": tofu)."""
        self._presence = Presence(
            grace_s=config.deadlines.outage_grace_s,
            on_change=lambda device, _online: self._key_epoch.device_changed(device),
        )
        refusals = RefusalLog(
            logger, keep=lambda *error: self._store.record_error(*error)
        )
        self._refusals = refusals
        self._devices = EnrolledDevices(
            config,
            trust=self._trust,
            presence=self._presence,
            refusals=refusals,
            clock=clock,
            changed=lambda device: self._key_epoch.device_changed(device),
        )
        identity_refusals = IdentityRefusals(config.key_epochs)
        self._retained = RetainedSweep(config.federation, self._outbox, self._telemetry)
        self._outgoing = outgoing = SigningPoint(
            config.federation, self._outbox, self._telemetry
        )
        rejections = Rejections(
            config.federation,
            telemetry=self._telemetry,
            refusals=refusals,
            outgoing=outgoing,
            clock=clock,
            round_index=lambda: stages.state.round,
        )
        self._admission = Admission(
            config,
            telemetry=self._telemetry,
            refusals=refusals,
            reject=rejections.reject,
            run=lambda: outgoing.run,
            is_enrolled=lambda device: device in self._devices.identities,
        )
        ending = Ending(
            config,
            plugin=self._plugin,
            final_output=final_output,
            send=outgoing.send,
            sign=outgoing.sign,
        )
        self._key_epoch = key_epoch = KeyEpoch(
            config,
            stages=stages,
            devices=self._devices,
            presence=self._presence,
            outgoing=outgoing,
            identity_refusals=identity_refusals,
            plugin=self._plugin,
            flicker=flicker,
            rng=rng,
            clock=clock,
            open_round=lambda now: self._rounds.start_round(now),
            forget_round=lambda: self._rounds.forget(),
        )
        self._rounds = RoundCycle(
            config,
            stages=stages,
            selection=self._selection,
            plugin=self._plugin,
            ending=ending,
            outgoing=outgoing,
            telemetry=self._telemetry,
            rng=rng,
            clock=clock,
            online=self._presence.online,
            epoch=lambda: key_epoch.work,
            epoch_view=key_epoch.view,
            epoch_sets=key_epoch.sets,
            start_key_epoch=key_epoch.start,
        )
        self._stage_functions: StageFunctions = {
            Stage.ENROLMENT: key_epoch.stage_enrolment,
            Stage.BALANCING: key_epoch.stage_balancing,
            Stage.KEY_EPOCH: key_epoch.stage_key_epoch,
            Stage.REGISTRATION: key_epoch.stage_registration,
            Stage.SELECTING: self._rounds.stage_selecting,
            Stage.TRAINING: self._rounds.stage_training,
            Stage.DONE: lambda now: None,
        }
        self._outage = BrokerOutage(
            self._presence, (stages, key_epoch, self._selection, self._plugin)
        )
        self._recovery = Recovery(
            config,
            stages=stages,
            rounds=self._rounds,
            devices=self._devices,
            presence=self._presence,
            identity_refusals=identity_refusals,
            key_epoch=key_epoch,
            selection=self._selection,
            plugin=self._plugin,
            flicker=flicker,
            outgoing=outgoing,
        )
        router = Router(COORDINATOR)
        self._inbox = Inbox(
            config,
            router=router,
            admission=self._admission,
            presence=self._presence,
            devices=self._devices,
            key_epoch=key_epoch,
            rounds=self._rounds,
            stages=stages,
            plugin=self._plugin,
            flicker=flicker,
            outage=self._outage,
            outgoing=outgoing,
            identity_refusals=identity_refusals,
            rejections=rejections,
            refusals=refusals,
            clock=clock,
            identity=lambda: self.identity,
            certificate=lambda: self._certificate,
            step=self._step,
        )
        key_epoch.register(router)
        self._selection.register(router)
        if flicker is not None:
            flicker.register(router)

    # --- lifecycle ------------------------------------------------------------

    @property
    def state(self) -> RoundState:
        """The current stage, epoch, round and deadline."""
        return self._stages.state

    @property
    def config(self) -> CoordinatorConfig:
        """The configuration."""
        return self._config

    @property
    def identity(self) -> DevicePublicIdentity:
        """The coordinator's public signing identity."""
        return self._identity.public()

    @property
    def run_id(self) -> str:
        """This run's id, once started (`CoordinatorStore.run_id`)."""
        return self._outgoing.run

    @property
    def store(self) -> CoordinatorStore:
        """The persistent store (for inspection and tests)."""
        return self._store

    @property
    def is_done(self) -> bool:
        """True once the configured number of rounds is complete."""
        return self._stages.state.stage is Stage.DONE

    @property
    def flicker(self) -> FlickerMethod | None:
        """FLICKER's coordinator half, if the federation runs it (for figures)."""
        return self._flicker

    @property
    def telemetry(self) -> Telemetry:
        """What the service did so far (counts, stages, rounds, recent errors)."""
        return self._telemetry

    @property
    def transport_stats(self) -> TransportStats:
        """Messages and payload bytes through the broker link so far."""
        transport = self._transport
        return TransportStats() if transport is None else transport.stats

    @property
    def is_connected(self) -> bool:
        """True while the broker link is up."""
        transport = self._transport
        return transport is not None and transport.is_connected

    def _traffic(self) -> tuple[int, int]:
        stats = self.transport_stats
        return stats.bytes_sent, stats.bytes_received

    @property
    def federation(self) -> str:
        """The federation id."""
        return self._config.federation

    @property
    def key_epoch(self) -> KeyEpoch:
        """The key epoch component (its view, its sets; for status and tests)."""
        return self._key_epoch

    @property
    def selection(self) -> SelectionMethod:
        """The federation's selection method (for status and tests)."""
        return self._selection

    def send(self, message: BaseMessage, device: str | None) -> None:
        """Queue a message (for methods: flushed after the current step)."""
        self._outgoing.send(message, device)

    def sign(self, message: SignedT) -> SignedT:
        """``message`` in this run, signed by the coordinator (for the plugin)."""
        return self._outgoing.sign(message)

    def device_identity(self, device: str) -> DevicePublicIdentity | None:
        """An enrolled device's identity keys (its peers verify it with them)."""
        return self._devices.identities.get(device)

    def device_certificate(self, device: str) -> bytes:
        """An enrolled device's operator certificate (b"": none, tofu)."""
        return self._devices.certificates.get(device, b"")

    def epoch_view(self) -> EpochView | None:
        """The current key epoch's public data (for the round plugin)."""
        with self._lock:
            return self._key_epoch.view()

    def online_devices(self) -> Set[str]:
        """Enrolled devices online and not sitting the epoch out (for the plugin).

        A maintained read-only view (O(1) to get and to test), never a copy.
        """
        return self._key_epoch.online

    def reannounce(self) -> None:
        """Publish the open round's announce again (rate-limited; for methods)."""
        self._rounds.reannounce()

    def start(self, *, stop: threading.Event | None = None) -> None:
        """Open the store, restore state, connect and resume the current stage.

        Without a transport given, a broker that is not up yet is waited for
        (`ursa.protocol.connect`) until it is, or until ``stop`` is set.
        """
        if self._started:
            raise RuntimeError("CoordinatorService.start() called twice")
        self._started = True
        cfg = self._config
        ensure_private_dir(cfg.state_dir, "coordinator state")
        self._identity = DeviceIdentity.load_or_create(
            cfg.state_dir, COORDINATOR, key_path=cfg.identity_key_path()
        )
        public = self._identity.public()
        (cfg.state_dir / IDENTITY_PUBLIC_FILENAME).write_text(
            f"{public.to_bytes().hex()}\nfingerprint {public.fingerprint()}\n"
        )  # first, so a start without its certificate yet leaves what to certify
        self._certificate = cfg.trust.own_certificate(
            self._trust, public, Role.COORDINATOR
        )
        self._store = CoordinatorStore(
            cfg.state_dir / DB_FILENAME, commit=cfg.store.policy()
        )
        self._outbox.wait_for(self._store)  # publish nothing a crash takes back
        now = self._clock()
        fresh = self._store.get_meta(STATE_KEY) is None
        run = self._store.run_id()
        self._outgoing.start(self._identity, run)
        logger.info("run %s%s", run, " (new)" if fresh else "")
        self._inbox.open(self._store)
        with self._lock:
            self._recovery.restore(self._store, now)
        context = self._method_context()
        self._plugin.attach(context)
        self._selection.attach(context)
        if self._flicker is not None:
            self._flicker.attach(
                federation=cfg.federation,
                run=run,
                num_classes=cfg.registry.num_classes,
                state_dir=cfg.state_dir,
                devices=self._devices.identities,
                certificates=self._devices.certificates,
                store=self._store,
                outbox=self._outbox,
                clock=self._clock,
                sign=self._outgoing.sign,
                seed=cfg.seed,
            )
        if self._transport is None:
            self._transport = connect_patiently(
                self._make_transport,
                what="coordinator",
                min_delay_s=cfg.broker.reconnect_min_delay_s,
                max_delay_s=cfg.broker.reconnect_max_delay_s,
                stop=stop or self._stopped,
            )
        else:
            self._subscribe(self._transport)
            if not self._transport.is_connected:
                self._transport.connect()
        if fresh:
            self._retained.clear_notices()
        self._publish_status(online=True)
        self._outage.started(self._transport.is_connected)
        with self._lock:
            self._recovery.resume(self._store, self._clock())
            self._resumed = True
            for topic, payload in self._admission.take_held():  # came in the restore
                self._admit_safely(topic, payload, charged=True)
            self._step(self._clock())
        self._flush()

    def _method_context(self) -> MethodContext:
        """The context methods are lent: the service's public surface only."""
        return MethodContext(
            federation=self._config.federation,
            store=self._store,
            online=self._key_epoch.online,
            epoch=self._key_epoch.view,
            sender=self.send,
            signer=self.sign,
            announcer=self.reannounce,
            identities=self.device_identity,
            certificates=self.device_certificate,
        )

    def _subscribe(self, transport: Transport) -> None:
        transport.set_handler(self.handle)
        transport.set_retained_handler(self._on_retained)
        for pattern in coordinator_subscriptions(self._config.federation):
            transport.subscribe(pattern)
        transport.subscribe(BRIDGE_STATE_FILTER)

    def _make_transport(self) -> Transport:
        from ursa.protocol.mqtt import MqttTransport

        will = (
            global_topic(self._config.federation, STATUS),
            self._outgoing.encode(self._status(online=False)),
        )
        transport = MqttTransport(
            self._config.broker.mqtt_config(COORDINATOR, will=will)
        )
        self._subscribe(transport)
        return transport

    def _step(self, now: float) -> None:
        self._stages.settle(self._stage_functions, now)

    def _status(self, *, online: bool) -> Status:
        return Status(
            federation=self._config.federation,
            round=self._stages.state.round,
            sender=COORDINATOR,
            online=online,
            state="serving" if online else "offline",
        )

    def _publish_status(self, *, online: bool) -> None:
        self._outgoing.send_raw(
            self._outgoing.encode(self._status(online=online)), "status", None
        )

    def tick(self) -> None:
        """Check deadlines and phase conditions now (the run loop calls it)."""
        with self._lock:
            try:
                gone = self._outage.watch(self._transport, self._clock())
                if gone:
                    with self._store.transaction():
                        self._inbox.departed(gone)
                self._key_epoch.revoked(self._devices.revocations())
                self._step(self._clock())
                self._refusals.flush(self._clock())
                self._store.flush_if_due()  # a batch no message or publish closed
            except Exception:
                logger.exception("stage step failed; will retry at the next tick")
        self._flush()
        self._retained.sweep(self._transport, self._clock())

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
        transport = self._transport
        if transport is not None and transport.is_connected:
            try:
                self._publish_status(online=False)
                self._outbox.drain(transport, 5.0)  # a handler's last answers too
                transport.flush(5.0)
            except TransportError as exc:
                logger.warning("could not flush on stop: %s", exc)
            self._outbox.close()  # a tick racing the stop: dropped quietly
            transport.close()
        if self._started:
            self._store.close()

    # --- outbox ---------------------------------------------------------------

    def _flush(self) -> None:
        """Publish queued messages outside the state lock."""
        self._outbox.flush(self._transport)

    # --- admission ------------------------------------------------------------

    def handle(self, topic: str, payload: bytes) -> None:
        """The transport handler: admit, dispatch, step; never raises.

        Until `start` has restored and resumed the current stage, messages are
        held, not judged: an update queued in the broker during a restart must
        not be refused as late because its round is not reopened yet.
        """
        with self._lock:
            if not self._resumed:
                self._admission.hold(topic, payload, self._clock())
                return
            self._admit_safely(topic, payload)
        self._flush()

    @property
    def held_dropped(self) -> int:
        """Messages dropped because too many arrived before the stage was restored."""
        return self._admission.held_dropped

    @property
    def retained_cleared(self) -> int:
        """Retained messages on device up topics cleared from the broker so far."""
        return self._retained.cleared

    def _on_retained(self, topic: str, payload: bytes) -> None:
        """A stored retained message: cleared if on a device's up topic.

        Everything else (statuses, bridge states) is handled as usual.
        """
        with self._lock:
            swept = self._retained.on_retained(topic, payload, self._clock())
        if not swept:
            self.handle(topic, payload)
            return
        self._flush()

    def _admit_safely(
        self, topic: str, payload: bytes, *, charged: bool = False
    ) -> None:
        try:
            self._inbox.admit(topic, payload, self._clock(), charged=charged)
        except Exception:
            logger.exception("internal error on a message from %s", topic)

    def run_drops(self) -> dict[str, int]:
        """Messages dropped per device because they belong to another run."""
        with self._lock:
            return self._admission.run_drops()

    def admission_stats(self) -> AdmissionStats:
        """Messages admitted and dropped by the per-device limits, so far."""
        with self._lock:
            return self._admission.stats()

    @property
    def site_links(self) -> dict[str, SiteLink]:
        """Every site bridge's last known state (read from any thread)."""
        return self._outage.site_links
