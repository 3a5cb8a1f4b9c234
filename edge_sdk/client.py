"""`EdgeClient`: the device side of ursa's selection protocol over a `Transport`.

What a device does (the coordinator's side is in ``coordinator/service.py``):

1. Connect (client id = username = device id; retained ``online`` status,
   last will ``offline``) and send `Hello` with its identity public keys;
   pin the coordinator identity from `EnrolResult` (or check the configured
   fingerprint).
2. On a signed `KeyEpochStart`: adopt the epoch and its registry parameters;
   compute the label histogram and category (Algorithm 1) locally. The agent
   (named in the notice) generates the Paillier key, publishes the signed
   public key and seals the secret key to every recipient; others verify the
   agent's signature and open their sealed box (bound to federation + epoch),
   checking the secret key matches the public key.
3. Register: encrypt the one-hot registry (pooled obfuscators) and send it.
   On `RegistrySum`: decrypt, check ``sum == num_parties`` (else refuse),
   keep the overall registry for eq. (6).
4. Dubhe (``methods/dubhe``), when it selects: on `RoundAnnounce` draw H
   coins with eq. (6)'s probability (persisted per round), send `Volunteer`;
   on `TryAssignment` send the encrypted label distribution; the agent
   decrypts `TrySums` and answers the best try, signed. On a signed
   `SelectionResult` naming this device (whatever selected it): `Trainer.train`,
   or with a `ModelTrainer` the training round of ``model_steps.py`` (model
   download, the methods' hooks such as CLIMB's dual step in
   ``methods/climb``, delta upload).
5. With a `PhasedTrainer` (FedDisk, ``methods/feddisk``): after each global
   MADE round, the encrypted validation loss on a `MeanRequest`, the
   decrypted fleet loss and the stop rule on its `MeanSum` (the agent sends
   the signed `MadeVerdict`), and the sample weights on `FeddiskSwitch`.
6. On the signed, retained `FederationEnd`: save the final model, call the
   app's ``on_finished``, set `finished` (``federation_end.py``).
7. A balancing method runs between enrolment and the first key epoch (its
   messages and transfers through the method hooks of ``method.py``); at
   that epoch its `replace_data` becomes the device's labels and training
   data, before the device registers.

Messages arrive in any order across topics: one that needs something not
known yet (the coordinator identity, the agent's identity, the key, the
registry) waits in a per-kind slot and is retried after every change. Every
answer has a deterministic message id, so answering twice (e.g. after a
coordinator restart re-announces) is idempotent. Nothing secret is logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from ursa._compat import StrEnum
from ursa.crypto.certificate import Role
from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.callbacks import DeviceCallbacks, DeviceError
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.device_core import DeviceStats, TrainingStats
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.downloads import ModelDownloads
from ursa.edge_sdk.federation_end import FINAL_DIRNAME, EndOfFederation
from ursa.edge_sdk.fleet_eval import FleetEvaluator
from ursa.edge_sdk.keys import EpochSteps
from ursa.edge_sdk.membership import HELLO_ON_NEW_RUN_S, RunMembership
from ursa.edge_sdk.method import DeviceMethod, EpochKeys, LocalData, Roster
from ursa.edge_sdk.methods.registry import compose_methods
from ursa.edge_sdk.methods_config import selection_kind
from ursa.edge_sdk.model_steps import ModelSteps
from ursa.edge_sdk.registration import RegistrationError
from ursa.edge_sdk.secure_mean import with_secure_means
from ursa.edge_sdk.state import DeviceStateDir
from ursa.edge_sdk.trainer import NoOpTrainer, Trainer
from ursa.models.weights import Arrays
from ursa.protocol.admission_limits import AdmissionLimiter, AdmissionStats
from ursa.protocol.connect import connect_patiently
from ursa.protocol.envelope import (
    decode,
    encode,
    message_kind,
    signed_by_coordinator,
)
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    BaseMessage,
    Chunk,
    ChunkRequest,
    EnrolResult,
    ErrorCode,
    ErrorReply,
    FederationEnd,
    Hello,
    IdentityKeys,
    KeyEpochStart,
    ModelAvailable,
    RegistryCheck,
    RegistrySum,
    Relay,
    SealedSecretKey,
    SealRequest,
    SecAggRoster,
    SecAggSetup,
    SecAggShareBundle,
    SecAggUnmask,
    SelectionResult,
    Status,
    TransferManifest,
)
from ursa.protocol.methods import MethodRole
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import Dispatch, NotReadyError, RejectedError, Router
from ursa.protocol.topics import device_subscriptions, parse_topic, status_topic
from ursa.protocol.transport import Transport, TransportError
from ursa.protocol.untrusted_text import escape

__all__ = [
    "HELLO_ON_NEW_RUN_S",
    "ClientState",
    "DeviceStats",
    "EdgeClient",
    "device_will",
]

logger = logging.getLogger("ursa.edge_sdk")

_REFUSALS = (CryptoError, RegistrationError, RejectedError, ValueError)
"""What a handler raises for a message it refuses: logged, never fatal."""

_ANY_RUN = (EnrolResult, ErrorReply)
"""Kinds a device takes from any run: a signed acceptance is how it joins a
run, and an error (`unknown_device`, `wrong_run`) only makes it say Hello."""


class ClientState(StrEnum):
    """Lifecycle of an `EdgeClient`."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


def device_will(config: DeviceConfig) -> tuple[str, bytes]:
    """A device's retained last will: `Status(online=False)` on its status topic."""
    offline = Status(
        federation=config.federation,
        round=0,
        sender=config.device_id,
        online=False,
        state="offline",
    )
    return status_topic(config.federation, config.device_id), encode(offline)


class EdgeClient(EpochSteps, ModelSteps):
    """One device in a federation: enrolment, key epochs, registration, selection.

    Args:
        config: The device configuration.
        labels: The device's training labels (class indices); only their
            histogram is used here, and it never leaves the device.
        transport: A transport (tests: in-memory); None builds an
            `MqttTransport` from ``config.broker``.
        trainer: Called when selected; default `NoOpTrainer`.
        methods: Device halves the app builds itself (e.g. a balancing
            method over its own samples); every other kind the device runs
            is built from its ``[[methods]]`` table or the trainer
            (`ursa.edge_sdk.methods.registry.compose_methods`).
        rng: The device's private randomness for the volunteer coins.
        callbacks: The app's hooks on the device's progress
            (`ursa.edge_sdk.callbacks`); one that raises is logged only.
    """

    def __init__(
        self,
        config: DeviceConfig,
        labels: Sequence[int] | NDArray[np.integer],
        *,
        transport: Transport | None = None,
        trainer: Trainer | None = None,
        methods: Sequence[DeviceMethod] | None = None,
        rng: np.random.Generator | None = None,
        callbacks: DeviceCallbacks | None = None,
    ) -> None:
        array = np.asarray(labels)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ValueError("labels must be a 1-D array of class indices")
        if array.size and array.min() < 0:
            raise ValueError("labels must be non-negative class indices")
        self._config = config
        self._callbacks = callbacks
        self._labels = array.astype(np.int64)
        self._trainer = trainer or NoOpTrainer(int(array.size))
        self._selection = selection_kind(config.method_list())
        self.evaluation = FleetEvaluator(config.eval_min_parties)
        """Federated evaluation: the fleet's accuracy as this device learns it."""
        self._methods = with_secure_means(
            [
                *compose_methods(
                    self._trainer, config.method_list(), self._labels, methods or ()
                ),
                self.evaluation,
            ]
        )
        self._data_settled = False
        if config.methods is not None:
            named = {m.kind for m in config.methods}
            if named != set(self.methods()):
                raise ValueError(
                    f"[[methods]] names {', '.join(sorted(named))}; the trainer "
                    f"runs {', '.join(self.methods())}"
                )
        self._rng = rng if rng is not None else np.random.default_rng()
        self._transport = transport
        self._lifecycle = ClientState.NEW
        self._was_connected = False
        self._connections = 0
        """`Transport.connections` when the device last said it is online."""
        self._lock = threading.RLock()
        self._outbox = Outbox(self._config.device_id)
        self._limiter = AdmissionLimiter(
            config.admission, max_message_bytes=config.max_message_bytes
        )
        self.stats = DeviceStats()
        self.enrolled = threading.Event()
        self._trust = config.trust.anchor(config.federation, config.device_id)
        self._certificate = b""
        self._coordinator: DevicePublicIdentity | None = None
        self._refused_coordinators: set[str] = set()
        self._epoch: KeyEpochStart | None = None
        self._epoch_payload = b""
        self._agent: DevicePublicIdentity | None = None
        self._public_key: PaillierPublicKey | None = None
        self._secret_key: PaillierSecretKey | None = None
        self._pool: ObfuscatorPool | None = None
        self._index: int | None = None
        self._registry: NDArray[np.int64] | None = None
        self._trained: set[int] = set()
        self._registered_epoch: int | None = None
        self._membership = RunMembership(
            device_id=config.device_id, say_hello=self._send_hello
        )
        self.training_stats = TrainingStats()
        """Counters of the training side (for demos and benchmarks)."""
        self._link = DeviceLink(config.federation, config.device_id, self._send)
        self.downloads = ModelDownloads(
            link=self._link,
            trainer=self._trainer,
            stats=self.training_stats,
            fits=self._fits,
            ready=self._on_downloaded,
        )
        self._init_model_steps()
        self._end = EndOfFederation(
            device_id=config.device_id,
            final_dir=config.state_dir / FINAL_DIRNAME,
            trainer=self._trainer,
            models=self.downloads,
            lock=self._lock,
            callbacks=callbacks,
        )
        self.finished = self._end.finished
        """Set once the federation is over (`ursa.edge_sdk.federation_end`)."""
        self._model_listeners = [self._end.on_model_ready]
        self._router = self._routes()

    # --- public view ----------------------------------------------------------

    @property
    def state(self) -> ClientState:
        """The lifecycle state."""
        return self._lifecycle

    @property
    def epoch(self) -> int | None:
        """The adopted key epoch, if any."""
        return None if self._epoch is None else self._epoch.epoch

    @property
    def has_registry(self) -> bool:
        """Whether the overall registry of the current epoch is decrypted."""
        return self._registry is not None

    @property
    def final_dir(self) -> Path:
        """Where the final model is saved."""
        return self._end.final_dir

    @property
    def transport(self) -> Transport | None:
        """The transport (after `start`)."""
        return self._transport

    def method(self, kind: type[MethodT]) -> MethodT:
        """This device's method of class ``kind`` (e.g. ``client.method(Climb)``).

        Raises:
            KeyError: the device does not run it.
        """
        for method in self._methods:
            if isinstance(method, kind):
                return method
        raise KeyError(f"{self.device_id} runs no {kind.__name__}")

    # --- lifecycle ------------------------------------------------------------

    def start(self, *, stop: threading.Event | None = None) -> None:
        """Load the state directory, connect, announce online and say hello.

        Without a transport given, a broker that is not up yet is waited for
        (`ursa.protocol.connect`: jittered backoff, a log line per attempt)
        until it is, or until ``stop`` is set.
        """
        if self._lifecycle is not ClientState.NEW:
            raise RuntimeError(f"start() in state {self._lifecycle}")
        cfg = self._config
        self._store = DeviceStateDir(cfg.state_dir)
        self._identity = DeviceIdentity.load_or_create(cfg.state_dir, cfg.device_id)
        self._certificate = cfg.trust.own_certificate(
            self._trust, self._identity.public(), Role.DEVICE
        )
        with self._lock:
            self._restore()
            self._restore_training()
        self._lifecycle = ClientState.RUNNING
        if self._transport is None:
            self._transport = connect_patiently(
                self._make_transport,
                what=f"device {cfg.device_id}",
                min_delay_s=cfg.broker.reconnect_min_delay_s,
                max_delay_s=cfg.broker.reconnect_max_delay_s,
                stop=stop,
            )
        else:
            self._subscribe(self._transport)
            if not self._transport.is_connected:
                self._transport.connect()
        with self._lock:
            self._send_hello()  # first: the status would ask an unenrolled device to
            self._publish_status(online=True)  # say hello (see the coordinator)
            self._was_connected = True
            self._connections = self._transport.connections
        self._flush()

    def _send_hello(self) -> None:
        self._hello_unanswered = True  # `_retry_hello` resends it until answered
        public = self._identity.public()
        self._send(
            Hello(
                federation=self._config.federation,
                round=0,
                sender=self.device_id,
                device_id=self.device_id,
                x25519_public=public.x25519_public,
                ed25519_public=public.ed25519_public,
                certificate=self._certificate,
            )
        )

    def stop(self) -> None:
        """Publish offline, disconnect and forget unused obfuscators (idempotent)."""
        if self._lifecycle is ClientState.STOPPED:
            return
        self._lifecycle = ClientState.STOPPED
        transport = self._transport
        if transport is not None and transport.is_connected:
            try:
                with self._lock:
                    self._publish_status(online=False)
                self._outbox.drain(transport, 5.0)
                transport.flush(5.0)
            except TransportError as exc:
                logger.warning("%s: could not flush on stop: %s", self.device_id, exc)
            self._outbox.close()  # a handler answering meanwhile: dropped quietly
            transport.close()
        if self._pool is not None:
            self._pool.close()

    def run(
        self,
        stop: threading.Event,
        *,
        poll_s: float = 1.0,
        until_finished: bool = True,
    ) -> None:
        """Start, serve (calling `poll` every ``poll_s``) until `stop`, then stop.

        With ``until_finished`` it also returns once the federation is over
        (`finished`: the final model saved, ``on_finished`` called).
        """
        self.start(stop=stop)
        try:
            while not stop.wait(poll_s):
                self.poll()
                if until_finished and self.finished.is_set():
                    logger.info("%s: federation over; stopping", self.device_id)
                    break
        finally:
            self.stop()

    def poll(self) -> None:
        """Periodic work: online after a reconnect, hello again, chunks, rounds."""
        try:
            with self._lock:
                self._announce_after_reconnect()
                self._retry_hello(time.monotonic())
                self._poll_training(time.monotonic())
        except Exception:
            logger.exception("%s: internal error in poll", self.device_id)
        self._flush()

    def _announce_after_reconnect(self) -> None:
        """Publish ``online`` again once the connection is back after a loss.

        A broker that stops publishes every client's will, so the retained
        status says ``offline`` until the device says otherwise; without this
        the coordinator counts the device as gone for good (issue 14). The
        transport's connection count catches a reconnect shorter than a poll.
        """
        transport = self._transport
        if transport is None:
            return
        connected = transport.is_connected
        count = transport.connections  # also a reconnect between two polls
        back = not self._was_connected or count != self._connections
        if connected and back and self._lifecycle is ClientState.RUNNING:
            logger.info("%s: reconnected; publishing online", self.device_id)
            self._publish_status(online=True)
        self._was_connected = connected
        if connected:
            self._connections = count

    def _make_transport(self) -> Transport:
        from ursa.protocol.mqtt import MqttTransport

        cfg = self._config
        will = device_will(cfg)
        transport = MqttTransport(cfg.broker.mqtt_config(cfg.device_id, will=will))
        self._subscribe(transport)
        return transport

    def _subscribe(self, transport: Transport) -> None:
        transport.set_handler(self.handle)
        for pattern in device_subscriptions(self._config.federation, self.device_id):
            transport.subscribe(pattern)

    def _restore(self) -> None:
        """Reload the pinned coordinator and the last key epoch from the state dir."""
        self._coordinator = self._store.load_coordinator()
        self._membership.restore(self._store)
        stored = self._store.load_epoch()
        if stored is None:
            return
        try:
            notice = decode(stored.notice)
        except ProtocolError as exc:
            # e.g. an epoch saved by an older version (no agent_keys): wait for
            # the coordinator's next notice instead of failing to start
            logger.warning("ignoring the stored key epoch: %s", exc)
            return
        if not isinstance(notice, KeyEpochStart):
            return
        self._adopt_epoch(notice, stored.notice, persist=False)
        if stored.agent is not None:
            self._agent = DevicePublicIdentity.from_bytes(stored.agent)
        if stored.public_key is not None:
            self._set_public_key(PaillierPublicKey.from_bytes(stored.public_key))
        self._secret_key = self._store.load_secret_key(notice.epoch)

    def _restore_training(self) -> None:
        for method in self._methods:
            method.start()

    # --- sending --------------------------------------------------------------

    def _status(self, *, online: bool) -> Status:
        return Status(
            federation=self._config.federation,
            round=0,
            sender=self.device_id,
            online=online,
            state="online" if online else "offline",
        )

    def _publish_status(self, *, online: bool) -> None:
        topic = status_topic(self._config.federation, self.device_id)
        status = self._in_run(self._status(online=online))
        self._outbox.put(topic, encode(status), 1, retain=True)

    def _flush(self) -> None:
        self._outbox.flush(self._transport)

    # --- receiving ------------------------------------------------------------

    def handle(self, topic: str, payload: bytes) -> None:
        """The transport handler: validate, dispatch, retry waiting messages."""
        if self._lifecycle is ClientState.STOPPED:
            return
        try:
            with self._lock:
                message = self._accept(topic, payload)
                if message is not None:
                    self._process(message)
                    self._replay_joined()
        except Exception:
            logger.exception("%s: internal error on %s", self.device_id, topic)
        self._flush()

    def _accept(self, topic: str, payload: bytes) -> BaseMessage | None:
        cfg = self._config
        if not payload:  # a retained message cleared (a new run), not a message
            return None
        try:
            parsed = parse_topic(topic)
            if not self._within_limits(parsed.device or "global", payload):
                return None
            message = decode(payload, max_size=cfg.max_message_bytes)
        except ProtocolError as exc:
            why = escape(f"{topic}: {exc}")
            logger.warning("%s: dropped message on %s", self.device_id, why)
            return None
        own = parsed.device == cfg.device_id and parsed.direction == "down"
        if parsed.federation != cfg.federation or not (own or parsed.scope == "global"):
            return None
        if message.federation != cfg.federation:
            logger.warning("%s: dropped message of another federation", self.device_id)
            return None
        kind = message_kind(message)
        if isinstance(message, Status):
            return None
        relay = type(message).relay
        relayed = relay is Relay.AGENT or (own and relay is Relay.PEER)
        if message.sender != COORDINATOR and not relayed:
            logger.warning(
                "%s: dropped %s claiming sender %s",
                self.device_id,
                kind,
                message.sender,
            )
            return None
        if message.run != self._membership.run and not isinstance(message, _ANY_RUN):
            self._membership.foreign(kind, message)
            return None
        return message

    def _replay_joined(self) -> None:
        """Handle what the run just joined sent before its acceptance, in order."""
        while (message := self._membership.next_joined()) is not None:
            self._process(message)

    def run_drops(self) -> dict[str, int]:
        """Messages dropped per foreign run id, so far."""
        with self._lock:
            return self._membership.drops()

    def _forget_run_state(self) -> None:
        """The old run's epoch, keys, model, transfers and waiting messages go."""
        if self._pool is not None:
            self._pool.close()
        self._epoch, self._epoch_payload, self._agent = None, b"", None
        self._public_key = self._secret_key = self._pool = None
        self._index = self._registry = self._registered_epoch = None
        self._sat_out_epoch = None
        self._trained = set()
        self._init_model_steps()
        self._router.clear_parked()
        for method in self._methods:
            method.new_run()

    def admission_stats(self) -> AdmissionStats:
        """Incoming messages admitted and dropped by the limits, so far."""
        with self._lock:
            return self._limiter.stats()

    def _within_limits(self, scope: str, payload: bytes) -> bool:
        """The rate and size limits per topic scope, before any decode.

        Everything a device receives is the coordinator's (the broker's ACL),
        on the global topics or its own; each scope has its own bucket. A
        drop is logged once per scope per `LOG_INTERVAL_S`, with a count.
        """
        verdict = self._limiter.admit(scope, len(payload), time.monotonic())
        if verdict.should_log and verdict.reason is not None:
            limits = self._config.admission
            logger.warning(
                "%s: dropping messages on %s topics over the admission limits "
                "(%g/s, burst %d, %d bytes; this one: %s): %d dropped since the "
                "last report",
                self.device_id,
                scope,
                limits.messages_per_s,
                limits.burst,
                self._limiter.max_message_bytes,
                verdict.reason.value,
                verdict.dropped_since_log,
            )
        return verdict.is_admitted

    def _routes(self) -> Router:
        """Every kind this device handles, by the step that owns it."""
        router = Router(self.device_id)
        epoch, rounds, model = "key_epoch", "selection", "model_transfer"
        router.register(EnrolResult, self._on_enrol_result, owner=epoch)
        router.register(ErrorReply, self._on_error_reply, owner="client")
        router.register(KeyEpochStart, self._on_key_epoch, owner=epoch)
        router.register(SealRequest, self._on_seal_request, owner=epoch)
        router.register(AgentPublicKey, self._on_agent_public_key, owner=epoch)
        router.register(SealedSecretKey, self._on_sealed_secret_key, owner=epoch)
        router.register(RegistrySum, self._on_registry_sum, owner=rounds)
        router.register(RegistryCheck, self._on_registry_check, owner=rounds)
        router.register(SelectionResult, self._on_selection_result, owner=rounds)
        router.register(ModelAvailable, self._on_model_available, owner=model)
        router.register(TransferManifest, self._on_manifest, owner=model)
        router.register(Chunk, self._on_any_chunk, owner=model)
        router.register(ChunkRequest, self._on_chunk_request, owner=model)
        router.register(SecAggSetup, self._on_secagg_setup, owner=model)
        router.register(SecAggRoster, self._on_secagg_roster, owner=model)
        router.register(SecAggShareBundle, self._on_secagg_bundle, owner=model)
        router.register(SecAggUnmask, self._on_secagg_unmask, owner=model)
        router.register(FederationEnd, self._end.on_federation_end, owner="end")
        context = _Context(self)
        for method in self._methods:
            method.attach(context, router)
        return router

    def _process(self, message: BaseMessage) -> None:
        """Dispatch; once a message is consumed, retry the ones that waited."""
        if not self._authentic(message):
            return
        try:
            outcome = self._router.dispatch(message)
        except _REFUSALS as exc:
            self._refused(message, exc)
            return
        if outcome is Dispatch.UNHANDLED:
            logger.debug("%s: no handler for %s", self.device_id, message_kind(message))
        elif outcome is Dispatch.HANDLED:
            self._router.retry_parked(self._refused)

    def _authentic(self, message: BaseMessage) -> bool:
        """Whether a coordinator message carries the pinned coordinator's signature.

        The one check of what the coordinator sends (every kind but a chunk:
        `envelope.signed_by_coordinator`), before any handler sees it. An
        `EnrolResult` is checked by its handler against the trust anchor (it
        is what pins the coordinator's key); an error before any key is
        pinned is taken unchecked, since all it can do is prompt a Hello.
        """
        if not signed_by_coordinator(message) or isinstance(message, EnrolResult):
            return True
        kind = message_kind(message)
        coordinator = self._coordinator
        if coordinator is None:
            if isinstance(message, ErrorReply):
                return True
            logger.warning(
                "%s: dropped %s: no coordinator key is pinned yet", self.device_id, kind
            )
            return False
        try:
            self._verify(coordinator, message)
        except CryptoError as exc:
            logger.warning(
                "%s: refused %s: %s: not signed by the pinned coordinator %s (%s)",
                self.device_id,
                kind,
                ErrorCode.BAD_SIGNATURE.value,
                coordinator.fingerprint()[:16],
                escape(str(exc)),
            )
            return False
        return True

    def _registration_key(self, epoch: int) -> bytes | None:
        """The first method's key for this epoch's registration (None: none)."""
        for method in self._methods:
            key = method.registration_key(epoch)
            if key is not None:
                return key
        return None

    def methods(self) -> tuple[str, ...]:
        """Selection, training (when the trainer trains models), balancing."""
        roles = [(m.role, m.name) for m in self._methods]
        balancing = tuple(name for role, name in roles if role is MethodRole.BALANCING)
        if self.model_trainer() is None:
            return (self._selection, *balancing)
        training = [name for role, name in roles if role is MethodRole.TRAINING]
        return (self._selection, *(training or ["fedavg"])[:1], *balancing)

    # --- before registration: the data the federation trains on ----------------

    def _on_key_epoch(self, message: KeyEpochStart) -> None:
        """The first signed key epoch ends any balancing run: take its data first."""
        if not self._data_settled:
            if self._coordinator is None:
                raise NotReadyError
            self._verify(self._coordinator, message)
            self._data_settled = True
            for method in self._methods:
                data = method.replace_data()
                if data is not None:
                    self._use_data(method.name, data)
        self._on_key_epoch_start(message)

    def _use_data(self, by: str, data: LocalData) -> None:
        """Labels (and the trainer's samples) as a method left them."""
        if len(data.labels) == 0:
            logger.error("%s: %s left no samples; keeping mine", self.device_id, by)
            return
        before = len(self._labels)
        if data.x is not None:
            try:
                self._trainer.use_data(data.x, data.labels)
            except (NotImplementedError, ValueError) as exc:
                logger.error("%s: %s's data not used: %s", self.device_id, by, exc)
                return
        self._labels = data.labels
        if isinstance(self._trainer, NoOpTrainer):
            self._trainer.num_examples = len(data.labels)
        logger.info(
            "%s: %s done: %d samples (%d before)",
            self.device_id,
            by,
            len(data.labels),
            before,
        )

    def _takes_transfer(self, message: TransferManifest | Chunk) -> bool:
        """Whether a method takes a transfer message (else it is a model's)."""
        return any(method.take_transfer(message) for method in self._methods)

    def _on_manifest(self, message: TransferManifest) -> None:
        if not self._takes_transfer(message):
            self.downloads.on_manifest(message)

    def _on_any_chunk(self, message: Chunk) -> None:
        if not self._takes_transfer(message):
            self.downloads.on_chunk(message)

    def _refused(self, message: BaseMessage, exc: Exception) -> None:
        if not isinstance(exc, _REFUSALS):
            raise exc
        if isinstance(exc, UntrustedIdentityError):
            self._refuse_untrusted(message, exc)
            return
        kind, why = message_kind(message), escape(str(exc))
        logger.warning("%s: refused %s: %s", self.device_id, kind, why)

    def _on_error_reply(self, message: ErrorReply) -> None:
        self._on_error(message)
        self._notify_error(
            DeviceError(
                message.round, message.code, escape(message.reason), "coordinator"
            )
        )
        for method in self._methods:
            method.on_error_reply(message)

    # --- enrolment and key epoch ----------------------------------------------

    # --- registration ---------------------------------------------------------

    # --- rounds ---------------------------------------------------------------


MethodT = TypeVar("MethodT", bound=DeviceMethod)


class _Context:
    """The `DeviceContext` an `EdgeClient` gives its methods."""

    def __init__(self, client: EdgeClient) -> None:
        self._client = client

    @property
    def device_id(self) -> str:
        return self._client.device_id

    @property
    def federation(self) -> str:
        return self._client._config.federation

    @property
    def store(self) -> DeviceStateDir:
        return self._client._store

    @property
    def stats(self) -> DeviceStats:
        return self._client.stats

    @property
    def training_stats(self) -> TrainingStats:
        return self._client.training_stats

    @property
    def trainer(self) -> Trainer:
        return self._client._trainer

    @property
    def model_version(self) -> int | None:
        return self._client.model_version

    @property
    def epoch(self) -> KeyEpochStart | None:
        return self._client._epoch

    @property
    def rng(self) -> np.random.Generator:
        return self._client._rng

    def send(self, message: BaseMessage) -> None:
        self._client._send(message)

    def roster(self) -> Roster | None:
        client = self._client
        if client._epoch is None or client._registry is None:
            return None
        return Roster(client._epoch.epoch, client._index, client._registry)

    def label_distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        return self._client._distribution(num_classes)

    def signed(self, message: BaseMessage) -> BaseMessage:
        return self._client._signed(message)

    def keys(self, epoch: int) -> EpochKeys:
        self._client._require_epoch(epoch)
        keys = self.current_keys()
        if keys is None:
            raise NotReadyError
        return keys

    def current_keys(self) -> EpochKeys | None:
        client = self._client
        if client._epoch is None or client._public_key is None:
            return None
        return EpochKeys(
            client._epoch, client._public_key, client._secret_key, client._pool
        )

    def model_arrays_at(self, version: int) -> Arrays | None:
        return self._client.downloads.arrays_at(version)

    def seconds_since_model_notice(self) -> float:
        return time.monotonic() - self._client._notice_at

    def seal_for(
        self, peer: DevicePublicIdentity, context: bytes, plaintext: bytes
    ) -> bytes:
        return seal(self._client._identity, peer, context, plaintext)

    def open_from(
        self, peer: DevicePublicIdentity, context: bytes, box: bytes
    ) -> bytes:
        return open_sealed(self._client._identity, peer, context, box)

    def peer_identity(self, keys: IdentityKeys) -> DevicePublicIdentity:
        return self._client._trusted(keys)

    def verify_coordinator(self, message: BaseMessage) -> None:
        coordinator = self._client._coordinator
        if coordinator is None:
            raise NotReadyError
        self._client._verify(coordinator, message)

    def retry_training(self) -> None:
        self._client._maybe_train()

    def forget_downloads(self) -> None:
        self._client._forget_downloads()
