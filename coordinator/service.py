"""The coordinator service: admission of every message, the stage loop, restarts.

The protocol as the coordinator runs it (SPEC §2, §3, §5; Dubhe Fig. 3-5)::

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

Admission (every incoming message, in order; a failure is logged with its
reason and, where the sender can act, answered with an `ErrorReply`):
topic parses and belongs to this federation; size cap; msgpack + pydantic
decode; federation; ``sender`` equals the topic's device (Mosquitto's ACL
stops a device publishing under another's topic); enrolled (except Hello and
status); not a message id seen before (persisted); then the stage handler
checks epoch, round, stage and role. Nothing a device sends can crash it: an
unexpected exception is logged with its traceback and its transaction rolls
back (the message is not marked seen, so a re-send is handled afresh).

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

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Set

import numpy as np

from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.core import REFUSING_KEY, STATE_KEY
from ursa.coordinator.device_sets import OnlineDevices
from ursa.coordinator.enrolment import decide_enrolment, enrol_result
from ursa.coordinator.federation_end import FinalOutput
from ursa.coordinator.identity_refusals import IdentityRefusals
from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.registry import selection_method
from ursa.coordinator.natural_keys import natural_key
from ursa.coordinator.plugin import EpochView, NoTraining, RoundPlugin, SignedT
from ursa.coordinator.presence import Presence
from ursa.coordinator.recovery import Recovery
from ursa.coordinator.refusal_log import RefusalLog, Stored
from ursa.coordinator.rounds import RoundState, Stage
from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.site_links import SiteLink, SiteLinks
from ursa.coordinator.startup_hold import MAX_HELD, StartupHold
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.certificate import Role
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.secret_file import ensure_private_dir
from ursa.protocol.admission_limits import (
    LOG_INTERVAL_S,
    AdmissionLimiter,
    AdmissionStats,
    DropReason,
)
from ursa.protocol.connect import connect_patiently
from ursa.protocol.envelope import decode, message_kind
from ursa.protocol.errors import DecodeError, OversizeError, TopicError, VersionError
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
    DEV,
    RETAINED_GLOBAL_NAMES,
    STATUS,
    UP,
    coordinator_subscriptions,
    federation_filter,
    global_topic,
    parse_bridge_state,
    parse_topic,
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

_SITS_OUT = frozenset(
    {
        ErrorCode.METHOD_MISMATCH,
        ErrorCode.DATA_MISMATCH,
        ErrorCode.MODEL_MISMATCH,
        ErrorCode.INSECURE_PARAMETERS,
    }
)
"""A device answering these does not fit the federation: not selected this epoch."""

RETAINED_SWEEP_S = 60.0
"""How often the device up filter is subscribed again, so that the broker
sends its retained messages there (which no honest device leaves) to be
cleared: a device's retained bytes live on the broker for at most this long."""
_FAILED = frozenset(
    {
        ErrorCode.TRAINING_FAILED,
        ErrorCode.EVALUATION_FAILED,
        ErrorCode.PLAIN_REFUSED,
        ErrorCode.SECURE_AGGREGATION_FAILED,
        ErrorCode.TRANSFER_FAILED,
    }
)
"""A selected device's own work failed (or the model it holds is not the signed
notice's): the open round stops waiting for it."""

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
        self._final_output = final_output
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
        self._state = RoundState()
        self._enrolled = {}
        self._certificates = {}
        self._trust = config.trust.anchor(config.federation, COORDINATOR)
        self._certificate = b""
        """The coordinator's own operator certificate (b"": tofu)."""
        self._presence = Presence(
            grace_s=config.deadlines.outage_grace_s,
            on_change=lambda device, _online: self._device_changed(device),
        )
        self._limiter = AdmissionLimiter(
            config.admission, max_message_bytes=config.max_message_bytes
        )
        self._refusals = RefusalLog(
            logger, keep=lambda *error: self._store.record_error(*error)
        )
        self._online = self._presence.online
        self._sat_out = {}
        self._connected = False
        self._epoch = None
        self._round = None
        self._started = False
        self._resumed = False
        self._refusing: set[str] = set()
        self._identity_refusals = IdentityRefusals(config.key_epochs)
        self._ready = set()
        self._online_view = OnlineDevices(
            self._ready, lambda: self._sat_out, lambda: self._state.epoch
        )
        self._held = StartupHold()
        self._retained_cleared = 0
        self._retained_logged: dict[str, float] = {}
        self._swept_at = 0.0
        self._site_links = SiteLinks()
        self._run_drops: dict[str, int] = {}
        self._run = ""
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
        return self._run

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
        self._send(message, device)

    def sign(self, message: SignedT) -> SignedT:
        """``message`` in this run, signed by the coordinator (for the plugin)."""
        return self._sign(message)

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
        self._run = self._store.run_id()
        logger.info("run %s%s", self._run, " (new)" if fresh else "")
        with self._lock:
            self._restore(now)
        context = self._method_context()
        self._plugin.attach(context)
        self._selection.attach(context)
        if self._flicker is not None:
            self._flicker.attach(
                federation=cfg.federation,
                run=self._run,
                num_classes=cfg.registry.num_classes,
                state_dir=cfg.state_dir,
                devices=self._enrolled,
                certificates=self._certificates,
                store=self._store,
                outbox=self._outbox,
                clock=self._clock,
                sign=self._sign,
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
            self._clear_retained()
        self._publish_status(online=True)
        self._connected = self._transport.is_connected
        with self._lock:
            self._resume(self._clock())
            if self._flicker is not None and self._state.stage is Stage.BALANCING:
                self._flicker.resume()
            self._resumed = True
            for topic, payload in self._held.take():  # came during the restore
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

    def _clear_retained(self) -> None:
        """A new run: delete an older run's retained notices from the broker.

        A coordinator started on an empty store under an existing federation
        name (a reset) must not leave devices the old run's key epoch, public
        key, registry sum or round to act on.
        """
        fed = self._config.federation
        for name in sorted(RETAINED_GLOBAL_NAMES - {STATUS}):
            self._outbox.put(global_topic(fed, name), b"", 1, True)

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
            self._encode(self._status(online=False)),
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
        self._send_raw(self._encode(self._status(online=online)), "status", None)

    def tick(self) -> None:
        """Check deadlines and phase conditions now (the run loop calls it)."""
        with self._lock:
            try:
                self._watch_connection(self._clock())
                self._apply_revocations()
                self._step(self._clock())
                self._refusals.flush(self._clock())
                self._store.flush_if_due()  # a batch no message or publish closed
            except Exception:
                logger.exception("stage step failed; will retry at the next tick")
        self._flush()
        self._sweep_retained(self._clock())

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
                self._hold(topic, payload)
                return
            self._admit_safely(topic, payload)
        self._flush()

    def _hold(self, topic: str, payload: bytes) -> None:
        """Keep a message until the stage is restored, within `StartupHold`'s caps.

        The message takes its token from the sender's admission bucket now
        (and is not charged again when replayed), so a device's backlog is
        held only as far as its rate allows, and within its share of bytes.
        """
        sender = _sender_of(topic)
        reason = None
        if sender:
            reason = self._limiter.admit(sender, len(payload), self._clock()).reason
        if reason is None and self._held.offer(sender, topic, payload):
            return
        if reason is not None:  # a rate or size drop: the hold never saw it
            self._held.drop(len(payload))
            self._telemetry.rejected(reason.value)
        dropped = self._held.dropped
        if dropped == 1 or dropped % 1000 == 0:
            logger.warning(
                "%d messages (%d bytes) dropped while starting up: over the "
                "hold's caps (%d messages, %d bytes, %d bytes per device) or a "
                "device's admission rate; last on %r",
                dropped,
                self._held.dropped_bytes,
                self._held.max_messages,
                self._held.max_bytes,
                self._held.max_sender_bytes,
                topic,
            )

    @property
    def held_dropped(self) -> int:
        """Messages dropped because too many arrived before the stage was restored."""
        return self._held.dropped

    @property
    def retained_cleared(self) -> int:
        """Retained messages on device up topics cleared from the broker so far."""
        return self._retained_cleared

    def _on_retained(self, topic: str, payload: bytes) -> None:
        """A stored retained message: cleared if on a device's up topic.

        No honest device retains there (only its status is retained), and the
        broker keeps what is retained for good and sends it again at every
        subscription: such a message is deleted (an empty retained publish),
        logged once per device per `LOG_INTERVAL_S` and never admitted.
        Everything else (statuses, bridge states) is handled as usual.
        """
        device = _up_device(self._config.federation, topic)
        if device is None:
            self.handle(topic, payload)
            return
        if not payload:
            return  # a cleared one
        with self._lock:
            self._retained_cleared += 1
            self._telemetry.rejected("retained")
            now = self._clock()
            logged = self._retained_logged.get(device)
            if logged is None or now - logged >= LOG_INTERVAL_S:
                self._retained_logged[device] = now
                logger.warning(
                    "cleared a retained message of %d bytes %s left on %r "
                    "(devices never retain on their up topics)",
                    len(payload),
                    device,
                    topic,
                )
            self._outbox.put(topic, b"", 1, True)
        self._flush()

    def _sweep_retained(self, now: float) -> None:
        """Subscribe to the device up filter again every `RETAINED_SWEEP_S`.

        The broker answers a subscription with the retained messages it
        matches; `_on_retained` clears them.
        """
        transport = self._transport
        if transport is None or not transport.is_connected:
            return
        if now - self._swept_at < RETAINED_SWEEP_S:
            return
        self._swept_at = now
        up_filter = coordinator_subscriptions(self._config.federation)[0]
        try:
            transport.subscribe(up_filter)
        except TransportError as exc:
            logger.warning("could not sweep retained messages: %s", exc)

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
        cfg = self._config
        try:
            link = parse_bridge_state(topic, payload)
            if link is not None:
                self._on_site_link(*link, now)
                return
            parsed = parse_topic(topic)
        except TopicError as exc:
            line = "rejected message on an invalid topic: %s"
            self._refusals.write(
                now, None, logging.WARNING, line, str(exc), kind="invalid_topic"
            )
            return
        device = parsed.device
        if parsed.federation != cfg.federation or device is None:
            line = "rejected message on foreign topic %s"
            self._refusals.write(
                now, None, logging.WARNING, line, topic, kind="foreign_topic"
            )
            return
        if parsed.direction == "down" or not payload:
            return  # our own publishes, if a broker echoes them; a cleared retain
        if not charged and not self._within_limits(device, payload, now):
            return
        try:
            message = decode(payload, max_size=cfg.max_message_bytes)
        except OversizeError as exc:
            self._reject(device, "message", ErrorCode.OVERSIZE, str(exc), None)
            return
        except VersionError as exc:
            self._reject(
                device, "message", ErrorCode.UNSUPPORTED_VERSION, str(exc), None
            )
            return
        except DecodeError as exc:
            self._reject(
                device, "message", ErrorCode.MALFORMED, exc.reason, exc.message_id
            )
            return
        kind = message_kind(message)
        self._telemetry.received(device, kind)
        if message.federation != cfg.federation:
            self._reject(
                device,
                kind,
                ErrorCode.UNAUTHORISED,
                "wrong federation",
                message.message_id,
            )
            return
        if message.sender != device:
            reason = f"sender {message.sender!r} does not match the topic's device"
            self._reject(
                device, kind, ErrorCode.UNAUTHORISED, reason, message.message_id
            )
            return
        if parsed.direction is None:
            self._on_status(device, message, now)
            return
        if kind != "hello" and message.run != self._run:
            self._wrong_run(device, kind, message)
            return
        if kind != "hello" and device not in self._enrolled:
            reason = "device is not enrolled (send hello)"
            self._reject(
                device, kind, ErrorCode.UNKNOWN_DEVICE, reason, message.message_id
            )
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

    def _wrong_run(self, device: str, kind: str, message: BaseMessage) -> None:
        """A message of another run: counted, answered `wrong_run`, not marked seen.

        The device is on an older run (this coordinator was reset) or on none;
        the answer makes it say Hello, and the signed `EnrolResult` takes it
        into this run.
        """
        self._run_drops[device] = self._run_drops.get(device, 0) + 1
        theirs = message.run or "(none)"
        reason = f"run {theirs} is not this coordinator's run {self._run}"
        self._reject(device, kind, ErrorCode.WRONG_RUN, reason, message.message_id)

    def run_drops(self) -> dict[str, int]:
        """Messages dropped per device because they belong to another run."""
        with self._lock:
            return dict(self._run_drops)

    def admission_stats(self) -> AdmissionStats:
        """Messages admitted and dropped by the per-device limits, so far."""
        with self._lock:
            return self._limiter.stats()

    def _within_limits(self, device: str, payload: bytes, now: float) -> bool:
        """The per-device rate and size limits, before any decode or crypto work.

        A drop is logged (an oversize one also answered) once per device per
        `LOG_INTERVAL_S`, with the count since the last line; the rest are
        only counted, so a flood floods neither the log nor the device.
        """
        verdict = self._limiter.admit(device, len(payload), now)
        if verdict.reason is not None:
            self._telemetry.rejected(verdict.reason.value)
        if verdict.is_admitted or not verdict.should_log:
            return verdict.is_admitted
        count = verdict.dropped_since_log
        if verdict.reason is DropReason.OVERSIZE:
            limit = self._limiter.max_message_bytes
            size = len(payload)
            reason = f"message of {size} bytes exceeds the limit of {limit} bytes"
            self._reject(
                device, "message", ErrorCode.OVERSIZE, reason, None, counted=True
            )
        if verdict.reason is DropReason.RATE or count > 1:
            limits = self._config.admission
            logger.warning(
                "dropping messages from %s over the admission limits (%g/s, burst "
                "%d, %d bytes): %d dropped since the last report",
                device,
                limits.messages_per_s,
                limits.burst,
                self._limiter.max_message_bytes,
                count,
            )
        return False

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
        router.register(ErrorReply, self._on_error_reply, owner=own)
        router.register(Heartbeat, lambda m: None, owner=own)
        return router

    def _on_error_reply(self, message: ErrorReply) -> None:
        report = functools.partial(
            self._refusals.write, self._clock(), message.sender, kind=message.code
        )
        if message.code == ErrorCode.COORDINATOR_IDENTITY_MISMATCH:
            self._check_identity_refusal(message)  # signed, names our acceptance
            self._refused_by(message.sender, message.reason)
            return
        if message.code == ErrorCode.UNTRUSTED_IDENTITY:  # someone swapped keys
            report(
                logging.ERROR,
                "%s refused keys this coordinator relayed: %s",
                message.sender,
                message.reason,
            )
            return
        if message.code in _SITS_OUT:  # an operator must act
            report(
                logging.ERROR,
                "%s sits out: %s: %s (excluded from key epoch %d)",
                message.sender,
                message.code,
                message.reason,
                self._state.epoch,
            )
            self._sit_out(message.sender)
            return
        if message.code in _FAILED:
            report(
                logging.WARNING,
                "%s reports %s in round %d: %s",
                message.sender,
                message.code,
                message.round,
                message.reason,
            )
            work = self._round
            training = self._state.stage is Stage.TRAINING
            if training and work is not None and message.round == work.round:
                self._plugin.on_device_failed(work.round, message.sender, message.code)
            return
        report(
            logging.INFO,
            "%s reports %s: %s",
            message.sender,
            message.code,
            message.reason,
        )

    def _refused_by(self, device: str, reason: str) -> None:
        """A device pinned another coordinator: name it and the remedy; count it out."""
        if device in self._refusing:
            return
        self._refusals.write(
            self._clock(),
            device,
            logging.ERROR,
            "%s refuses this coordinator (%s); it sits out until re-pinned "
            "(`ursa device repin` on it) or this coordinator's identity.key is "
            "restored from backup",
            device,
            reason,
            kind=ErrorCode.COORDINATOR_IDENTITY_MISMATCH,
        )
        self._refusing.add(device)
        self._device_changed(device)
        self._store.set_meta(REFUSING_KEY, json.dumps(sorted(self._refusing)))
        self._rekey_for_refusal(device)  # rate-limited per device (`keys`)

    def _dispatch(self, message: BaseMessage) -> None:
        """The router's handler, else the training plugin's (in an open round)."""
        if self._router.dispatch(message) is not Dispatch.UNHANDLED:
            return
        kind = message_kind(message)
        if isinstance(message, ChunkRequest):  # downloads, in any stage
            if self._flicker is None or not self._flicker.answers(message):
                self._plugin.on_message(self._state.round, message, self._send)
        elif self._state.stage is Stage.TRAINING and self._round is not None:
            if message.round != self._round.round:
                raise RejectedError(
                    ErrorCode.WRONG_ROUND, f"round {message.round} not open"
                )
            self._plugin.on_message(self._round.round, message, self._send)
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

    def _on_site_link(self, site: str, up: bool, now: float) -> None:
        """A site bridge's state: log it; give open windows a link outage back."""
        outage = self._site_links.update(site, up, now)
        if not up:
            logger.warning(
                "site link %s is down: its devices cannot reach us until it is back",
                site,
            )
        elif outage > 0:
            logger.info("site link %s is back after %.0f s", site, outage)
            self._extend_deadline(outage)

    @property
    def site_links(self) -> dict[str, SiteLink]:
        """Every site bridge's last known state (read from any thread)."""
        return self._site_links.snapshot()

    def _extend_deadline(self, outage_s: float) -> None:
        """Give the open stage back the time the broker was away."""
        deadline = self._state.deadline_at
        if outage_s > 0 and deadline is not None:
            logger.info("stage deadline extended by the outage's %.0f s", outage_s)
            self._set_state(
                dataclasses.replace(self._state, deadline_at=deadline + outage_s)
            )
        if outage_s > 0:  # and the methods' own windows
            self._selection.extend_deadlines(outage_s)
            self._plugin.extend_deadlines(outage_s)

    def _watch_connection(self, now: float) -> None:
        """Tell the presence about our own connection; apply ended holds."""
        transport = self._transport
        connected = transport is not None and transport.is_connected
        if connected != self._connected:
            self._connected = connected
            if not connected:
                logger.warning("lost the broker: holding phases open")
                self._presence.connection_lost(now)
            else:
                outage = self._presence.connection_back(now)
                self._extend_deadline(outage)
        gone = self._presence.release(now)
        if gone:
            with self._store.transaction():
                self._departed(gone)

    def _on_hello(self, message: Hello) -> None:
        device = message.sender  # admission checked it is the topic's device
        if device in self._refusing:  # a new try, e.g. after `ursa device repin`
            self._refusing.discard(device)
            self._device_changed(device)
            self._store.set_meta(REFUSING_KEY, json.dumps(sorted(self._refusing)))
        known = self._enrolled.get(device)
        listed, policy = self._enrolment()
        decision = decide_enrolment(message, known, policy, listed.revoked, self._trust)
        if decision.accepted and decision.is_new and decision.identity is not None:
            self._store.enrol(
                device,
                decision.identity.to_bytes(),
                decision.identity.fingerprint(),
                self._clock(),
            )
            self._enrolled[device] = decision.identity
            self._presence.arrived(device)
            self._device_changed(device)
            self._store.set_online(device, True)
            logger.info("enrolled %s (%s)", device, decision.identity.fingerprint())
        certificate = bytes(message.certificate)
        if decision.accepted and certificate != self._certificates.get(device, b""):
            self._store.set_certificate(device, certificate)  # checked, or renewed
            self._certificates[device] = certificate
        elif not decision.accepted:
            self._refusals.write(
                self._clock(),
                device,
                logging.WARNING,
                "refused enrolment of %s: %s",
                device,
                decision.reason,
                kind="refused_enrolment",
                stored=Stored("hello", "refused", decision.reason),
            )
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
            reply = self._sign(reply)
            self._identity_refusals.sent(reply)  # the one it may refuse
        self._send(reply, device)

    # --- the stage loop -------------------------------------------------------

    def _step(self, now: float) -> None:
        """Run the current stage's function until the stage stops changing."""
        stages: dict[Stage, Callable[[float], None]] = {
            Stage.ENROLMENT: self._stage_enrolment,
            Stage.BALANCING: self._stage_balancing,
            Stage.KEY_EPOCH: self._stage_key_epoch,
            Stage.REGISTRATION: self._stage_registration,
            Stage.SELECTING: self._stage_selecting,
            Stage.TRAINING: self._stage_training,
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
                self._advance(Stage.BALANCING, now, None)
                return
            self._start_key_epoch(now, frozenset())

    def _stage_balancing(self, now: float) -> None:
        """FLICKER's run (its own deadlines), then the first key epoch."""
        online = self._online_enrolled()
        if self._flicker is None or self._flicker.step(now, online):
            self._start_key_epoch(now, frozenset())


def _sender_of(topic: str) -> str:
    """The device a topic belongs to, or ``""`` (global, bridge, invalid)."""
    try:
        return parse_topic(topic).device or ""
    except TopicError:
        return ""


def _up_device(federation: str, topic: str) -> str | None:
    """The device whose up subtree ``topic`` is in (any depth), else None."""
    prefix = federation_filter(federation)[:-1]  # "ursa/v1/<federation>/"
    if not topic.startswith(prefix):
        return None
    levels = topic[len(prefix) :].split("/")
    if len(levels) < 3 or levels[0] != DEV or levels[2] != UP or not levels[1]:
        return None
    return levels[1]
