"""The coordinator service: admission of every message, the stage loop, restarts.

The protocol as the coordinator runs it (docs/protocol.md; Dubhe Fig. 3-5)::

    1  device -> Hello(identity keys) ---------------------------> pinned / TOFU
       coordinator -> EnrolResult(accepted, coordinator identity) -> device
    2  device -> status (retained online; last will offline)  -> coordinator
       (an online status of an unenrolled device, e.g. one whose Hello came
       before the coordinator subscribed, is answered `unknown_device`; the
       device then says Hello again)
    3  [>= min_devices online]  KeyEpochStart (signed, retained) -> all
       coordinator -> agent's Hello (relayed) -> every recipient
       coordinator -> SealRequest pages (recipients' keys) -> agent
       agent -> AgentPublicKey (signed) -> coordinator -> all (retained)
       agent -> SealedKeys per page -> coordinator -> SealedSecretKey -> recipient
    4  device -> Registration(Enc(one-hot registry)) -> running sum
       [all online recipients or deadline]  RegistrySum -> all (retained)
    5  RoundAnnounce(round, K, H, deadline) -> all (retained)
       SELECTING: the selection method's own messages and windows (Dubhe:
       Volunteer, TryAssignment, EncryptedDistribution, TrySums, AgentAnswer;
       with the stratified draw first RankRequest/SealedRanks/SealedRank once
       per key epoch; `ursa.coordinator.methods.dubhe`), until it names the
       participants
       SelectionResult (signed, K) -> all (a private selection: to each
       selected device alone, naming only it); RoundPlugin trains
       round complete (persisted once) -> next round, or a new key epoch

Phases close early once every *online* device they wait on has answered (a
last will removes a device at once), else at their deadline. A selection
method may ask for a new key epoch before the next round (Dubhe, when its
agent is offline or silent). Devices enrolled after a key epoch started join
at the next one.

Admission (every incoming message; `ursa.coordinator.admission`): topic,
size and rate, decode, federation, sender, run and enrolment; then the
message id not seen before (persisted); then the stage handler checks
epoch, round, stage and role. Nothing a device sends can crash it: an
unexpected exception is logged with its traceback and its transaction rolls
back (the message is not marked seen, so a re-send is handled afresh).

The service wires its parts and runs their lifecycle: admission, the
enrolled devices (`enrolled_devices`), the run's `RoundState`
(`stage_machine`), what it sends (`signing_point`), the
rounds (`round_cycle`), error replies (`error_replies`), broker and
site-link outages (`broker_outage`: one loop extends every live phase), the
retained sweep (`retained_sweep`), the end of the federation (`ending`), and
the context its methods are lent (`method_context`); the key epoch's stages
and the restart (`keys`, `recovery`) are still its bases.

Restart: state, epochs, rounds, the methods' progress and seen ids live in
SQLite; on start the service reloads them, gives the current stage a fresh
deadline and re-publishes what the stage waits on (key notice, public key,
registry sum, announce, last selection; the selection method re-sends its
own). Devices answer
idempotently with the same message ids, so nothing is counted twice. The
store commits in batches (`ursa.coordinator.store`, ``[store]``): the outbox
publishes nothing before the batch that produced it is committed, so a
``kill -9`` loses only messages that nothing published has revealed, and the
re-published requests bring them back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Set

import numpy as np

from ursa.coordinator.admission import Admission
from ursa.coordinator.broker_outage import BrokerOutage
from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.core import STATE_KEY
from ursa.coordinator.device_sets import OnlineDevices
from ursa.coordinator.ending import Ending
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.enrolment import enrol_result
from ursa.coordinator.error_replies import ErrorReplies
from ursa.coordinator.federation_end import FinalOutput
from ursa.coordinator.identity_refusals import IdentityRefusals
from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.registry import selection_method
from ursa.coordinator.natural_keys import natural_key
from ursa.coordinator.plugin import EpochView, NoTraining, RoundPlugin, SignedT
from ursa.coordinator.presence import Presence
from ursa.coordinator.recovery import Recovery
from ursa.coordinator.refusal_log import RefusalLog
from ursa.coordinator.retained_sweep import RETAINED_SWEEP_S, RetainedSweep
from ursa.coordinator.round_cycle import RoundCycle
from ursa.coordinator.rounds import RoundState, Stage
from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.site_links import SiteLink
from ursa.coordinator.stage_machine import StageMachine
from ursa.coordinator.startup_hold import MAX_HELD
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.certificate import Role
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.secret_file import ensure_private_dir
from ursa.protocol.admission_limits import (
    AdmissionStats,
)
from ursa.protocol.connect import connect_patiently
from ursa.protocol.envelope import message_kind
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    BaseMessage,
    ChunkRequest,
    ErrorCode,
    ErrorReply,
    Heartbeat,
    Hello,
    Registration,
    RegistryVerdict,
    SealedKeys,
    SealedSecretKey,
    Status,
)
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.topics import (
    BRIDGE_STATE_FILTER,
    STATUS,
    coordinator_subscriptions,
    global_topic,
    parse_bridge_state,
)
from ursa.protocol.transport import Transport, TransportError, TransportStats

__all__ = [
    "IDENTITY_PUBLIC_FILENAME",
    "MAX_HELD",
    "RETAINED_SWEEP_S",
    "CoordinatorService",
]

logger = logging.getLogger("ursa.coordinator")

TRANSIENT_CODES = frozenset(
    {ErrorCode.LATE, ErrorCode.WRONG_ROUND, ErrorCode.WRONG_EPOCH}
)
"""Refusals that depend on when a message came, not on what it says: such a
message is not marked seen, so the device's retransmission is judged afresh."""

IDENTITY_PUBLIC_FILENAME = "coordinator.pub"
"""Hex of the coordinator's public identity, for devices that pin it by config."""


class CoordinatorService(Recovery):
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
        self._selection = selection_method(config)
        self._rng = rng if rng is not None else np.random.default_rng(config.seed)
        self._transport = transport
        self._lock = threading.RLock()
        self._outbox = Outbox("coordinator")
        self._stopped = threading.Event()
        self._stages = StageMachine(self._telemetry)
        self._trust = config.trust.anchor(config.federation, COORDINATOR)
        self._certificate = b""
        """The coordinator's own operator certificate (b"": tofu)."""
        self._presence = Presence(
            grace_s=config.deadlines.outage_grace_s,
            on_change=lambda device, _online: self._device_changed(device),
        )
        self._refusals = RefusalLog(
            logger, keep=lambda *error: self._store.record_error(*error)
        )
        self._devices = EnrolledDevices(
            config,
            trust=self._trust,
            presence=self._presence,
            refusals=self._refusals,
            clock=self._clock,
            changed=lambda device: self._device_changed(device),
        )
        self._enrolled = self._devices.identities
        self._certificates = self._devices.certificates
        self._refusing = self._devices.refusing
        self._online = self._presence.online
        self._sat_out = {}
        self._epoch = None
        self._started = False
        self._resumed = False
        self._identity_refusals = IdentityRefusals(config.key_epochs)
        self._ready = set()
        self._online_view = OnlineDevices(
            self._ready, lambda: self._sat_out, lambda: self._state.epoch
        )
        self._retained = RetainedSweep(config.federation, self._outbox, self._telemetry)
        self._outgoing = SigningPoint(config.federation, self._outbox, self._telemetry)
        self._admission = Admission(
            config,
            telemetry=self._telemetry,
            refusals=self._refusals,
            reject=self._reject,
            run=lambda: self._outgoing.run,
            is_enrolled=lambda device: device in self._enrolled,
        )
        self._ending = Ending(
            config,
            plugin=self._plugin,
            final_output=final_output,
            send=self._outgoing.send,
            sign=self._outgoing.sign,
        )
        self._rounds = RoundCycle(
            config,
            stages=self._stages,
            selection=self._selection,
            plugin=self._plugin,
            ending=self._ending,
            outgoing=self._outgoing,
            telemetry=self._telemetry,
            rng=self._rng,
            clock=self._clock,
            online=self._online,
            epoch=lambda: self._epoch,
            epoch_view=self._epoch_view,
            epoch_sets=self._epoch_sets,
            start_key_epoch=self._start_key_epoch,
        )
        self._outage = BrokerOutage(
            self._presence,
            (
                self._stages,
                self._selection,
                self._plugin,
            ),
        )
        self._router = self._routes()
        self._selection.register(self._router)
        spec = config.flicker_method()
        if flicker is None and spec is not None:
            flicker = FlickerMethod(spec)
        if flicker is not None:
            if spec is None:
                raise ValueError("a FLICKER method, but [[methods]] names no flicker")
            flicker.register(self._router)
        self._flicker = flicker

    # --- lifecycle ------------------------------------------------------------

    @property
    def state(self) -> RoundState:
        """The current stage, epoch, round and deadline."""
        return self._state

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
        return self._state.stage is Stage.DONE

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
        return self._enrolled.get(device)

    def device_certificate(self, device: str) -> bytes:
        """An enrolled device's operator certificate (b"": none, tofu)."""
        return self._certificates.get(device, b"")

    def epoch_view(self) -> EpochView | None:
        """The current key epoch's public data (for the round plugin)."""
        with self._lock:
            return self._epoch_view()

    def online_devices(self) -> Set[str]:
        """Enrolled devices online and not sitting the epoch out (for the plugin).

        A maintained read-only view (O(1) to get and to test), never a copy.
        """
        return self._online_view

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
        with self._lock:
            self._restore(now)
        context = self._method_context()
        self._plugin.attach(context)
        self._selection.attach(context)
        if self._flicker is not None:
            self._flicker.attach(
                federation=cfg.federation,
                run=run,
                num_classes=cfg.registry.num_classes,
                state_dir=cfg.state_dir,
                devices=self._enrolled,
                certificates=self._certificates,
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
            self._resume(self._clock())
            if self._flicker is not None and self._state.stage is Stage.BALANCING:
                self._flicker.resume()
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
            online=self._online_view,
            epoch=self.epoch_view,
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

    def _status(self, *, online: bool) -> Status:
        return Status(
            federation=self._config.federation,
            round=self._state.round,
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
                        self._departed(gone)
                self._apply_revocations()
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
            self._admit(topic, payload, self._clock(), charged=charged)
        except Exception:
            logger.exception("internal error on a message from %s", topic)

    def _admit(
        self, topic: str, payload: bytes, now: float, *, charged: bool = False
    ) -> None:
        """Judge one message (``charged``: its admission token is already taken)."""
        link = parse_bridge_state(topic, payload)
        if link is not None:
            self._outage.site_link(*link, now)
            return
        admitted = self._admission.judge(topic, payload, now, charged=charged)
        if admitted is None:
            return
        device, message, kind = admitted.device, admitted.message, admitted.kind
        if admitted.on_status_topic:
            self._on_status(device, message, now)
            return
        natural = natural_key(message)  # its stored record de-duplicates it
        if self._store.is_duplicate(message.message_id, natural):
            logger.debug(
                "duplicate %s %s from %s ignored", kind, message.message_id, device
            )
            return
        with self._store.transaction():  # joins the open batch (group commit)
            if device in self._enrolled and self._presence.arrived(device):
                self._store.set_online(device, True)
                self._epoch_arrived(device)
            try:
                self._dispatch(message)
            except RejectedError as exc:
                self._reject(device, kind, exc.code, exc.reason, message.message_id)
                if exc.code not in TRANSIENT_CODES:
                    self._store.mark_seen(message.message_id, now)
            else:
                logger.debug(
                    "%s of round %d from %s admitted", kind, message.round, device
                )
                if natural is None:
                    self._store.mark_seen(message.message_id, now)
            self._step(now)

    def run_drops(self) -> dict[str, int]:
        """Messages dropped per device because they belong to another run."""
        with self._lock:
            return self._admission.run_drops()

    def admission_stats(self) -> AdmissionStats:
        """Messages admitted and dropped by the per-device limits, so far."""
        with self._lock:
            return self._admission.stats()

    def _routes(self) -> Router:
        """The runtime's handlers (admission already checked each sender)."""
        router = Router(COORDINATOR)
        own = "coordinator"
        router.register(Hello, self._on_hello, owner=own)
        router.register(AgentPublicKey, self._on_agent_public_key, owner=own)
        router.register(SealedSecretKey, self._on_sealed_secret_key, owner=own)
        router.register(SealedKeys, self._on_sealed_keys, owner=own)
        router.register(Registration, self._on_registration, owner=own)
        router.register(RegistryVerdict, self._on_registry_verdict, owner=own)
        replies = ErrorReplies(
            self._refusals,
            clock=self._clock,
            epoch=lambda: self._state.epoch,
            refused=self._refused_by_reply,
            sit_out=self._sit_out,
            failed=self._device_failed,
        )
        router.register(ErrorReply, replies.on_error_reply, owner=own)
        router.register(Heartbeat, lambda m: None, owner=own)
        return router

    def _refused_by_reply(self, message: ErrorReply) -> None:
        """A device refused our identity: check its signed reply, count it out."""
        self._check_identity_refusal(message)  # signed, names our acceptance
        self._refused_by(message.sender, message.reason)

    def _device_failed(self, round_index: int, device: str, code: str) -> None:
        """A selected device's work failed: the open round stops waiting for it."""
        work = self._rounds.work
        training = self._state.stage is Stage.TRAINING
        if training and work is not None and round_index == work.round:
            self._plugin.on_device_failed(work.round, device, code)

    def _refused_by(self, device: str, reason: str) -> None:
        """A device pinned another coordinator: count it out, key again if due."""
        if self._devices.refused_by(device, reason):
            self._rekey_for_refusal(device)  # rate-limited per device (`keys`)

    def _dispatch(self, message: BaseMessage) -> None:
        """The router's handler, else the training plugin's (in an open round)."""
        if self._router.dispatch(message) is not Dispatch.UNHANDLED:
            return
        kind = message_kind(message)
        if isinstance(message, ChunkRequest):  # downloads, in any stage
            if self._flicker is None or not self._flicker.answers(message):
                self._plugin.on_message(self._state.round, message, self._outgoing.send)
        elif self._state.stage is Stage.TRAINING and self._rounds.work is not None:
            if message.round != self._rounds.work.round:
                raise RejectedError(
                    ErrorCode.WRONG_ROUND, f"round {message.round} not open"
                )
            self._plugin.on_message(
                self._rounds.work.round, message, self._outgoing.send
            )
        else:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"a device may not send {kind} now"
            )

    def _on_status(self, device: str, message: BaseMessage, now: float) -> None:
        if not isinstance(message, Status):
            self._reject(
                device,
                message_kind(message),
                ErrorCode.MALFORMED,
                "only status messages go on the status topic",
                message.message_id,
            )
            return
        if device not in self._enrolled:
            if message.online:  # its hello may have preceded our subscription
                reason = "device is not enrolled (send hello)"
                self._reject(device, "status", ErrorCode.UNKNOWN_DEVICE, reason, None)
            return
        presence = self._presence
        with self._store.transaction():
            if message.online:
                if not presence.arrived(device):
                    return
                logger.info("%s is online", device)
                self._store.set_online(device, True)
                self._epoch_arrived(device)
            elif presence.left(device, now):
                logger.info("%s is offline", device)
                self._departed({device})
            elif device in presence.held:
                logger.info("%s is offline (held: a possible outage)", device)
                for held in presence.held:  # a burst takes earlier departures back
                    self._store.set_online(held, True)
                return
            else:
                return
            self._step(now)

    def _departed(self, devices: set[str]) -> None:
        """Record departures the presence applied (last wills, or a hold ended)."""
        for device in sorted(devices):
            self._store.set_online(device, False)
            if self._epoch is not None:
                self._epoch.left(device)
            if self._flicker is not None:
                self._flicker.device_left(device)

    @property
    def site_links(self) -> dict[str, SiteLink]:
        """Every site bridge's last known state (read from any thread)."""
        return self._outage.site_links

    def _on_hello(self, message: Hello) -> None:
        device = message.sender  # admission checked it is the topic's device
        decision = self._devices.hello(message)
        reply = enrol_result(
            decision,
            self.identity,
            federation=self._config.federation,
            round_index=self._state.round,
            device_id=device,
            epoch=self._state.epoch or None,
            certificate=self._certificate,
        )
        if reply.accepted:
            reply = self._outgoing.sign(reply)
            self._identity_refusals.sent(reply)  # the one it may refuse
        self._outgoing.send(reply, device)

    # --- the stage loop -------------------------------------------------------

    def _step(self, now: float) -> None:
        """Run the current stage's function until the stage stops changing."""
        stages: dict[Stage, Callable[[float], None]] = {
            Stage.ENROLMENT: self._stage_enrolment,
            Stage.BALANCING: self._stage_balancing,
            Stage.KEY_EPOCH: self._stage_key_epoch,
            Stage.REGISTRATION: self._stage_registration,
            Stage.SELECTING: self._rounds.stage_selecting,
            Stage.TRAINING: self._rounds.stage_training,
            Stage.DONE: lambda now: None,
        }
        for _ in range(16):
            before = self._state
            stages[before.stage](now)
            if self._state == before:
                return

    def _stage_enrolment(self, now: float) -> None:
        cfg = self._config
        needed = cfg.min_devices if self._state.epoch == 0 else cfg.epoch_quorum()
        if len(self._online_enrolled()) >= needed:
            if self._flicker is not None and not self._flicker.is_over:
                self._stages.advance(Stage.BALANCING, now, None)
                return
            self._start_key_epoch(now, frozenset())

    def _stage_balancing(self, now: float) -> None:
        """FLICKER's run (its own deadlines), then the first key epoch."""
        online = self._online_enrolled()
        if self._flicker is None or self._flicker.step(now, online):
            self._start_key_epoch(now, frozenset())
