"""A fleet whose one device forges its secure-mean reports (decrypted-means rows).

The real coordinator (`CoordinatorService` with the training plugin and its
before-training steps) and real `EdgeClient` devices on the in-memory bus;
one device's transport rewrites the ciphertext of every `MeanReport` it
sends, as a modified SDK publishing on its own topic would. The forged
vector is packed by hand, slot by slot, so it can hold what no honest codec
encodes (beyond ``max_value``, or below the offset: a negative value).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.coordinator.conftest import Federation
from tests.coordinator.test_training import INITIAL, LinearTrainer
from ursa.coordinator.before_training import StepBuilder
from ursa.coordinator.methods_config import (
    ClimbSpec,
    DubheSpec,
    FedAvgSpec,
    FeddiskSpec,
)
from ursa.coordinator.plugin import PluginBuilder, PluginContext
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.crypto.encoding import FixedPoint
from ursa.crypto.paillier import EncryptedVector, PaillierPublicKey
from ursa.edge_sdk import methods_config as device_specs
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.methods.feddisk.phased_trainer import Phase
from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
from ursa.edge_sdk.trainer import ClassCounts, LocalDelta, ModelTrainer
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.envelope import decode, encode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import MeanReport

__all__ = [
    "ATTACKER",
    "EvaluatingTrainer",
    "FixedMadeTrainer",
    "Forge",
    "ForgingTransport",
    "RecordingTrainer",
    "forged_vector",
    "real_slot",
    "start_fleet",
]

ATTACKER = "d05"
Spec = ClimbSpec | FedAvgSpec | FeddiskSpec
DeviceSpec = (
    device_specs.ClimbDeviceSpec
    | device_specs.FedAvgDeviceSpec
    | device_specs.FeddiskDeviceSpec
)
DEVICE_TRAINING: dict[str, type[DeviceSpec]] = {
    "climb": device_specs.ClimbDeviceSpec,
    "fedavg": device_specs.FedAvgDeviceSpec,
    "feddisk": device_specs.FeddiskDeviceSpec,
}
"""The federation's training method."""
PLAIN = AggregationConfig(mode="plain")
"""The rows are about the means; plain rounds keep the suite fast."""

Forge = Callable[[MeanReport, PaillierPublicKey], bytes]
"""``(honest report, epoch key) -> forged ciphertext bytes``."""


def real_slot(codec: FixedPoint, value: float) -> int:
    """The slot integer of ``value`` in ``codec``'s fixed point, with no range check."""
    return round(value * 2**codec.scale_bits) + codec.offset


def forged_vector(
    public_key: PaillierPublicKey,
    codec: FixedPoint,
    max_parties: int,
    slots: Sequence[int],
) -> bytes:
    """One party's packed vector of raw ``slots`` (each in ``[0, 2**slot_bits)``)."""
    layout = codec.layout(max_parties, public_key.key_bits)
    bits, per = layout.slot_bits, layout.slots_per_plaintext
    ciphertexts = []
    for start in range(0, len(slots), per):
        plaintext = 0
        for slot in reversed(slots[start : start + per]):
            if not 0 <= slot < 1 << bits:
                raise ValueError(f"slot {slot} outside [0, 2**{bits})")
            plaintext = (plaintext << bits) | slot
        ciphertexts.append(public_key.raw_encrypt(plaintext))
    vector = EncryptedVector(
        public_key.fingerprint(), len(slots), 1, tuple(ciphertexts)
    )
    return vector.to_bytes(public_key)


class ForgingTransport(InMemoryTransport):
    """A device's transport that swaps the ciphertext of its `MeanReport` s."""

    def __init__(
        self,
        bus: InMemoryBus,
        client_id: str,
        forge: Forge,
        public_key: Callable[[], PaillierPublicKey | None],
        **kwargs: Any,
    ) -> None:
        super().__init__(bus, client_id, **kwargs)
        self._forge = forge
        self._public_key = public_key
        self.forged = 0

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Publish, a mean report with the forged ciphertext."""
        try:
            message = decode(payload)
        except ProtocolError:
            message = None
        key = self._public_key()
        if isinstance(message, MeanReport) and key is not None:
            forged = message.model_copy(
                update={"ciphertext": self._forge(message, key)}
            )
            payload = encode(forged)
            self.forged += 1
        super().publish(topic, payload, qos=qos, retain=retain)


class RecordingTrainer(LinearTrainer):
    """`LinearTrainer` that notes the weight (delta scale) of every round it trains."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.scales: list[tuple[int, float]] = []

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        self.scales.append((round_index, delta_scale))
        return super().train_delta(round_index, global_arrays, delta_scale=delta_scale)


@dataclass
class Fleet:
    """The started federation, its plugin, the devices' trainers and the forger."""

    fed: Federation
    plugin: Any
    trainers: dict[str, ModelTrainer]
    forger: ForgingTransport | None


def training_plugin(fed: Federation, tmp_path: Path) -> PluginBuilder:
    """Plain rounds of `INITIAL` (the runtime's steps before each)."""
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(INITIAL))

    def build(ctx: PluginContext) -> TrainingPlugin:
        return TrainingPlugin(
            ctx,
            federation=fed.config.federation,
            state_dir=fed.config.state_dir,
            config=TrainingConfig(aggregation=PLAIN),
            initial_weights=initial,
            clock=fed.clock,
        )

    return build


def start_fleet(
    fed: Federation,
    *,
    plugin: PluginBuilder,
    steps: Sequence[StepBuilder] = (),
    training: Spec,
    forge: Forge | None,
    trainer: Callable[[int], ModelTrainer],
    device_training: DeviceSpec | None = None,
) -> Fleet:
    """The real coordinator with ``plugin`` and ``steps``, a device per id, the forger.

    The devices' ``[[methods]]`` are Dubhe and ``device_training`` (default:
    ``training``'s kind with its device defaults).

    Runs every round the in-memory bus can run without a deadline (as
    `tests.coordinator.test_training.start_training`).
    """
    fed.config = fed.config.model_copy(update={"methods": (DubheSpec(), training)})
    own = device_training or DEVICE_TRAINING[training.kind]()
    device_methods = (device_specs.DubheDeviceSpec(), own)
    fed.coordinator = CoordinatorService(
        fed.config,
        transport=InMemoryTransport(fed.bus, "coordinator"),
        clock=fed.clock,
        plugin=plugin,
        steps=steps,
    )
    fed.coordinator.start()
    trainers: dict[str, ModelTrainer] = {}
    forger: ForgingTransport | None = None
    for index, device_id in enumerate(fed.device_ids):
        config = fed.device_config(device_id).model_copy(
            update={"allow_plain_aggregation": True, "methods": device_methods}
        )
        will = device_will(config)
        transport: InMemoryTransport
        if device_id == ATTACKER and forge is not None:

            def key(device: str = device_id) -> PaillierPublicKey | None:
                return fed.devices[device].epoch_view.public_key

            forger = ForgingTransport(fed.bus, device_id, forge, key, will=will)
            transport = forger
        else:
            transport = InMemoryTransport(fed.bus, device_id, will=will)
        trainers[device_id] = trainer(index)
        client = EdgeClient(
            config,
            np.arange(10).repeat(3),
            transport=transport,
            trainer=trainers[device_id],
            rng=np.random.default_rng(index),
        )
        fed.devices[device_id] = client
        fed.transports[device_id] = transport
        client.start()
    fed.settle()
    return Fleet(fed, fed.coordinator.plugin, trainers, forger)


def run_out(fed: Federation, seconds: float, *, ticks: int = 100) -> None:
    """Let deadlines of ``seconds`` pass until the run is done (or ``ticks`` ran)."""
    for _ in range(ticks):
        if fed.coordinator.is_done:
            return
        fed.tick(seconds)
        fed.settle()


def honest_ids(fed: Federation) -> list[str]:
    """Every device but the attacker."""
    return [d for d in fed.device_ids if d != ATTACKER]


def max_abs(arrays: Arrays) -> float:
    """The largest magnitude in a model."""
    return max(float(np.max(np.abs(v))) for v in arrays.values())


def selections(fed: Federation) -> dict[int, tuple[str, ...]]:
    """Each round's selected devices, as the coordinator announced them."""
    return {m.round: m.selected for _, m in fed.messages("selection_result")}


def weighted_oracle(
    fleet: Fleet, weights: Callable[[int, str], float], rounds: int
) -> Arrays:
    """The global model of ``rounds`` equal-share rounds with each delta scaled.

    ``weights(round, device)`` is the scale the device's delta has in that
    round (CLIMB: the round averages the scaled deltas of its selected).
    """
    arrays = {k: v.astype(np.float32) for k, v in INITIAL.items()}
    chosen = selections(fleet.fed)
    for r in range(1, rounds + 1):
        step = {k: np.zeros(v.shape, np.float64) for k, v in arrays.items()}
        for device in chosen[r]:
            trainer = fleet.trainers[device]
            assert isinstance(trainer, LinearTrainer)
            delta = trainer.delta(arrays)
            for k in step:
                step[k] += weights(r, device) * delta[k] / len(chosen[r])
        arrays = {k: (arrays[k] + step[k]).astype(np.float32) for k in arrays}
    return arrays


def refusals(fed: Federation, purpose: str) -> dict[int, set[str]]:
    """Per round, the devices that answered ``mean_refused`` for ``purpose``."""
    out: dict[int, set[str]] = {}
    for _, message in fed.messages("error"):
        if message.code == "mean_refused" and message.reason.startswith(purpose):
            out.setdefault(message.round, set()).add(message.sender)
    return out


class EvaluatingTrainer(RecordingTrainer):
    """Evaluates on two samples per class: device ``i`` gets class ``i % C`` wrong."""

    NUM_CLASSES = 10

    @property
    def evaluates(self) -> bool:
        return True

    def class_counts(self, global_arrays: Arrays) -> ClassCounts:
        total = np.full(self.NUM_CLASSES, 2, dtype=np.int64)
        correct = total.copy()
        correct[self.index % self.NUM_CLASSES] = 0
        return ClassCounts(correct, total)


class FixedMadeTrainer(ModelTrainer):
    """FedDisk's two phases in numpy: a MADE whose validation NLL falls each round.

    Device ``i`` holds ``10 + i`` validation samples; its NLL at a MADE is
    ``2 + i / 10 - version / 4``, the version read off the weights (each
    round adds 1 to ``w[0]``), so the honest fleet's loss falls every round
    and its stopper never stops (the coordinator's round cap ends phase 1).
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.settings = FeddiskSettings()
        self.phase: Phase = "made"
        self.model = self.settings.made_model
        self.switched: list[bool] = []

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        delta = {k: np.zeros_like(v) for k, v in global_arrays.items()}
        if self.phase == "made":
            delta["w"][0] = 1.0  # the next version
        return LocalDelta(delta, 10)

    def local_loss(self, global_arrays: Arrays) -> float:
        return 0.0

    def validation_loss(self, made_arrays: Arrays) -> tuple[float, int]:
        version = float(made_arrays["w"][0] - INITIAL["w"][0])
        return 2.0 + self.index / 10 - version / 4, 10 + self.index

    def switch(self, global_made: Arrays | None) -> dict[str, float]:
        self.switched.append(global_made is not None)
        self.phase, self.model = "classifier", "classifier"
        return {}

    def restore_weights(self, weights: npt.NDArray[np.float64] | None) -> None:
        self.phase, self.model = "classifier", "classifier"

    @property
    def sample_weights(self) -> npt.NDArray[np.float64] | None:
        return None
