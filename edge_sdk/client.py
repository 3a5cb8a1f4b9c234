"""`EdgeClient`: the device side of ursa's protocol over a `Transport`.

Wiring and lifecycle (the coordinator's side is ``coordinator/service.py``):
each step is a part the client owns and hands its collaborators (the shared
`DeviceLink`: identity, pinned coordinator, outbox):

1. `DeviceConnection` connects (retained ``online`` status, last will
   ``offline``); `Enrolment` says `Hello`, pins the coordinator from the
   signed `EnrolResult` and joins its run (`RunMembership`).
2. `DeviceKeyEpochs` adopts a signed `KeyEpochStart`, computes the registry slot
   (Algorithm 1), makes (the agent) or opens the epoch's Paillier key,
   registers and decrypts the overall registry (its `KeyEpochView`).
3. `DeviceMethods`, each built over the `DeviceMethodContext`: Dubhe, CLIMB,
   FedDisk, a balancing method before the first key epoch.
4. `TrainingRounds`: selected, it downloads the model, trains and uploads
   the (masked) delta.
5. `EndOfFederation`: the signed, retained `FederationEnd` saves the final
   model, calls ``on_finished`` and sets `finished`.

`DeviceInbox` takes what arrives through `DeviceAdmission` to the router.
Every answer has a deterministic message id (answering twice is idempotent);
nothing secret is logged. A device kept running after the end
(``run(until_finished=False)``) follows the coordinator's next run: that
run's state starts afresh, the identity and the pin stay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ursa._compat import StrEnum
from ursa.edge_sdk.admission import DeviceAdmission
from ursa.edge_sdk.callbacks import DeviceCallbacks
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.connection import DeviceConnection, device_will
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.device_methods import DeviceMethods, MethodT
from ursa.edge_sdk.enrolment import Enrolment
from ursa.edge_sdk.epoch_view import CurrentEpoch
from ursa.edge_sdk.federation_end import FINAL_DIRNAME, EndOfFederation
from ursa.edge_sdk.fleet_eval import FleetEvaluator
from ursa.edge_sdk.inbox import DeviceInbox
from ursa.edge_sdk.key_epoch import DeviceKeyEpochs
from ursa.edge_sdk.local_dataset import LocalDataset
from ursa.edge_sdk.membership import HELLO_ON_NEW_RUN_S, RunMembership
from ursa.edge_sdk.method import MethodFactory
from ursa.edge_sdk.method_context import DeviceMethodContext
from ursa.edge_sdk.stats import DeviceStats
from ursa.edge_sdk.trainer import ModelTrainer, Trainer
from ursa.edge_sdk.training_rounds import TrainingRounds
from ursa.models.weights import Arrays
from ursa.protocol.admission_limits import AdmissionStats
from ursa.protocol.messages import EnrolResult, FederationEnd
from ursa.protocol.outbox import Outbox
from ursa.protocol.transport import Transport

__all__ = [
    "HELLO_ON_NEW_RUN_S",
    "ClientState",
    "DeviceStats",
    "EdgeClient",
    "device_will",
]

logger = logging.getLogger("ursa.edge_sdk")


class ClientState(StrEnum):
    """Lifecycle of an `EdgeClient`."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class EdgeClient:
    """One device in a federation: enrolment, key epochs, registration, selection.

    Args:
        config: The device configuration.
        labels: The device's training labels (class indices); only their
            histogram is used here, and it never leaves the device.
        transport: A transport (tests: in-memory); None builds an
            `MqttTransport` from ``config.broker``.
        trainer: Called when selected; default `NoOpTrainer`.
        methods: Factories (``ctx -> method``, `MethodFactory`) of the device
            halves the app builds itself; the others are built from the
            ``[[methods]]`` table (`ursa.edge_sdk.methods.registry`).
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
        methods: Sequence[MethodFactory] | None = None,
        rng: np.random.Generator | None = None,
        callbacks: DeviceCallbacks | None = None,
    ) -> None:
        self.data = LocalDataset(config.device_id, labels, trainer)
        """The labels and the trainer (`ursa.edge_sdk.local_dataset`)."""
        self._config = config
        self._lifecycle = ClientState.NEW
        self._lock = threading.RLock()
        self.stats = DeviceStats()
        self._membership = RunMembership(
            device_id=config.device_id, say_hello=lambda: self.enrolment.say_hello()
        )
        outbox = Outbox(config.device_id)
        self.link = DeviceLink(config, outbox, self._membership)
        """Who this device is on the wire, its pin and its way out."""
        self._connection = DeviceConnection(self.link, outbox, transport)
        self.admission = DeviceAdmission(self.link, self._membership)
        self.enrolment = Enrolment(
            link=self.link, membership=self._membership, forget_run=self._new_run
        )
        self.enrolled = self.enrolment.enrolled
        self.key_epoch = DeviceKeyEpochs(
            link=self.link,
            data=self.data,
            stats=self.stats,
            method_names=lambda: self._methods.names(),
            registration_key=lambda epoch: self._methods.registration_key(epoch),
            model_problems=lambda: self.training.model_problems,
            settle_data=lambda: self._methods.settle_data(),
        )
        ctx = DeviceMethodContext(
            link=self.link,
            view=self.key_epoch.view,
            data=self.data,
            training=lambda: self.training,  # built next, over the methods
            stats=self.stats,
            rng=rng if rng is not None else np.random.default_rng(),
        )
        self._methods = DeviceMethods(config, self.data, ctx, methods or ())
        self.evaluation = self._methods.of(FleetEvaluator)
        """Federated evaluation: the fleet's accuracy as this device learns it."""
        self.training = TrainingRounds(
            link=self.link,
            view=self.key_epoch.view,
            data=self.data,
            methods=self._methods,
            device_stats=self.stats,
            callbacks=callbacks,
            sit_out=self.key_epoch.sit_out,
            model_ready=lambda: self._end.on_model_ready(),
        )
        self.downloads = self.training.downloads
        self.training_stats = self.training.stats
        """Counters of the training side (for demos and benchmarks)."""
        self._end = EndOfFederation(
            device_id=config.device_id,
            final_dir=config.state_dir / FINAL_DIRNAME,
            trainer=self.data.trainer,
            models=self.downloads,
            sits_out=lambda: self.key_epoch.view.sits_out,
            lock=self._lock,
            callbacks=callbacks,
        )
        self.finished = self._end.finished
        """Set once the run's federation is over; cleared when a new run is joined."""
        self._inbox = DeviceInbox(
            link=self.link,
            admission=self.admission,
            membership=self._membership,
            lock=self._lock,
            enrolment=self.enrolment,
            methods=self._methods,
            callbacks=callbacks,
        )
        self.router = self._inbox.router
        self._routes()

    # --- public view ----------------------------------------------------------

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self._config.device_id

    @property
    def state(self) -> ClientState:
        """The lifecycle state."""
        return self._lifecycle

    @property
    def epoch_view(self) -> CurrentEpoch:
        """The current key epoch: notice, agent, keys, slot, registry."""
        return self.key_epoch.view

    @property
    def epoch(self) -> int | None:
        """The adopted key epoch, if any."""
        notice = self.key_epoch.view.notice
        return None if notice is None else notice.epoch

    @property
    def has_registry(self) -> bool:
        """Whether the overall registry of the current epoch is decrypted."""
        return self.key_epoch.view.registry is not None

    @property
    def sits_out(self) -> bool:
        """Whether the device sits the current key epoch out (it does not fit)."""
        return self.key_epoch.view.sits_out

    @property
    def model_version(self) -> int | None:
        """The latest global model version downloaded."""
        return self.downloads.model_version

    @property
    def model_arrays(self) -> Arrays | None:
        """The latest global model downloaded (e.g. to serve inference)."""
        return self.downloads.model_arrays

    @property
    def final_dir(self) -> Path:
        """Where the final model is saved."""
        return self._end.final_dir

    @property
    def transport(self) -> Transport | None:
        """The transport (after `start`)."""
        return self._connection.transport

    def model_trainer(self) -> ModelTrainer | None:
        """The trainer, if it trains a model (else the device only selects)."""
        return self.data.model_trainer

    def method(self, kind: type[MethodT]) -> MethodT:
        """This device's method of class ``kind`` (e.g. ``client.method(Climb)``).

        Raises:
            KeyError: the device does not run it.
        """
        return self._methods.of(kind)

    def methods(self) -> tuple[str, ...]:
        """Selection, training (when the trainer trains models), balancing."""
        return self._methods.names()

    def run_drops(self) -> dict[str, int]:
        """Messages dropped per foreign run id, so far."""
        with self._lock:
            return self._membership.drops()

    def admission_stats(self) -> AdmissionStats:
        """Incoming messages admitted and dropped by the limits, so far."""
        with self._lock:
            return self.admission.stats()

    # --- lifecycle ------------------------------------------------------------

    def start(self, *, stop: threading.Event | None = None) -> None:
        """Load the state directory, connect, announce online and say hello.

        Without a transport given, a broker that is not up yet is waited for
        (`ursa.protocol.connect`: jittered backoff, a log line per attempt)
        until it is, or until ``stop`` is set.
        """
        if self._lifecycle is not ClientState.NEW:
            raise RuntimeError(f"start() in state {self._lifecycle}")
        store = self.link.open()
        with self._lock:
            self._membership.restore(store)
            self.key_epoch.restore()
            self._methods.start()
        self._lifecycle = ClientState.RUNNING
        self._connection.open(self.handle, stop)
        with self._lock:
            self.enrolment.say_hello()  # first: the status would ask an unenrolled
            self._connection.publish_status(online=True)  # device to say hello
            self._connection.went_online()
        self._connection.flush()

    def stop(self) -> None:
        """Publish offline, disconnect and forget unused obfuscators (idempotent)."""
        if self._lifecycle is ClientState.STOPPED:
            return
        self._lifecycle = ClientState.STOPPED
        self._connection.close(self._lock)
        self.key_epoch.close()

    def run(
        self, stop: threading.Event, *, poll_s: float = 1.0, until_finished: bool = True
    ) -> None:
        """Start, serve (calling `poll` every ``poll_s``) until `stop`, then stop.

        With ``until_finished`` it also returns once the federation is over
        (`finished`: the final model saved, ``on_finished`` called); without,
        it keeps the device connected and follows the coordinator's next run
        (``ursa coordinator new-run``), finishing each run it takes part in.
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
                running = self._lifecycle is ClientState.RUNNING
                self._connection.announce_after_reconnect(running=running)
                self.enrolment.retry_hello(time.monotonic())
                self.training.poll(time.monotonic())
        except Exception:
            logger.exception("%s: internal error in poll", self.device_id)
        self._connection.flush()

    def _new_run(self) -> None:
        """The old run's epoch, keys, model, transfers and waiting messages go."""
        self.key_epoch.new_run()
        self.training.new_run()
        self.router.clear_parked()
        self._methods.new_run()
        self._end.new_run()

    def handle(self, topic: str, payload: bytes) -> None:
        """The transport handler: validate, dispatch, retry waiting messages."""
        if self._lifecycle is not ClientState.STOPPED:
            self._inbox.receive(topic, payload)  # under the lock; errors logged
        self._connection.flush()

    def _routes(self) -> None:
        """Every kind this device handles, by the part that owns it."""
        router = self.router
        router.register(EnrolResult, self.enrolment.on_enrol_result, owner="enrol")
        self.key_epoch.register(router)
        self.training.register(router)
        router.register(FederationEnd, self._end.on_federation_end, owner="end")
        self._methods.register(router)
