"""Broker and transfers: one device's bytes cannot crowd out the honest fleet.

Each table row of issue 28 (docs/bounded_influence.md, "Broker and
transfers"): upload manifests that reserve the round's transfer budget, a
chunk request that makes the coordinator send a whole model again and again,
weight headers that declare 80,000 arrays or a 2^64-value shape (in memory,
against the real coordinator and devices), and a device's retained and
queued messages on a real Mosquitto with the generated config.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.coordinator.conftest import FEDERATION, Federation
from tests.coordinator.test_training import PLAIN, start_training
from ursa.coordinator.config import BrokerConfig as CoordinatorBroker
from ursa.coordinator.config import CoordinatorConfig, EnrolmentConfig
from ursa.coordinator.model_transfer import DEFAULT_MAX_CHUNK_REQUESTS
from ursa.coordinator.service import RETAINED_SWEEP_S, CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk.client import EdgeClient
from ursa.models.weights import (
    MAGIC,
    WeightsError,
    WeightsFormatError,
    WeightsSpecError,
    arrays_from_bytes,
    arrays_to_bytes,
)
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.messages import ChunkRequest, ModelUpdate, TransferManifest
from ursa.protocol.mqtt import MqttTransport
from ursa.protocol.topics import status_topic, up_topic
from ursa.tools.broker.mosquitto import MosquittoBroker

MIB = 1024 * 1024
ATTACKER = "d00"
OBSERVER = "observer"
HONEST = ("d01", "d02")


# --- in memory: a round whose attacker strikes at the first honest upload -----


def _small_messages(client: EdgeClient) -> None:
    """Every update goes as a chunked upload; lost chunks are asked at once."""
    client.training.uploads.inline_limit = 16
    client.training.uploads.chunk_size = 16
    client.downloads.retry_s = 0.0


def _round_with(
    tmp_path: Path, strike: Callable[[Federation], None]
) -> tuple[Federation, TrainingPlugin]:
    """One plain round, all three devices selected; ``strike`` runs once,
    when the first honest upload reaches the coordinator.

    The attacker's own SDK sends no update (its messages are ``strike``'s,
    from a raw session on its topics), so the round closes at its deadline
    with the honest devices' updates.
    """
    fed = Federation(tmp_path, num_devices=3, k=3, tries=1, rounds=1)
    fed.raw  # noqa: B018 -- connected now, not inside the bus's routing
    struck: list[bool] = []

    def watch(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        mine = f"/dev/{ATTACKER}/up/" in topic
        if mine and sender == ATTACKER and _is_upload(payload):
            return True  # the attacker's SDK would upload honestly: it does not
        honest_upload = topic.endswith("/up/transfer") and not mine
        if receiver == "coordinator" and honest_upload and not struck:
            struck.append(True)
            strike(fed)
        return False

    fed.bus.drop_filter = watch
    plugin = start_training(
        fed,
        tmp_path,
        TrainingConfig(aggregation=PLAIN, chunk_size=1024, update_timeout_s=5),
        prepare=_small_messages,
    )
    for _ in range(40):
        if fed.coordinator.is_done:
            break
        for client in fed.devices.values():
            client.poll()
        fed.tick(1.0)
    assert struck, "the round never saw an honest upload"
    return fed, plugin


def _is_upload(payload: bytes) -> bool:
    try:
        kind = decode(payload).kind
    except ProtocolError:
        return False
    return kind in ("model_update", "transfer_manifest", "chunk")


def _honest_round(fed: Federation, plugin: TrainingPlugin) -> None:
    """The round completed and counted every honest device; the model is finite."""
    assert fed.coordinator.is_done
    record = plugin.history[-1]
    assert set(HONEST) <= set(record.contributed), record
    for value in plugin.global_arrays.values():
        assert np.all(np.isfinite(value))


def _manifest(index: int, round_index: int) -> TransferManifest:
    size = 64 * MIB
    return TransferManifest(
        federation=FEDERATION,
        round=round_index,
        sender=ATTACKER,
        transfer_id=f"{index:032x}",
        purpose="model_update",
        total_size=size,
        chunk_size=MIB,
        chunk_count=size // MIB,
        sha256="0" * 64,
    )


def test_eight_64_mib_manifests_refuse_no_honest_upload(tmp_path: Path) -> None:
    def strike(fed: Federation) -> None:
        for index in range(8):
            fed.send_as(ATTACKER, _manifest(index, fed.coordinator.state.round))

    fed, plugin = _round_with(tmp_path, strike)

    _honest_round(fed, plugin)
    for device in HONEST:
        refused = [e for e in fed.errors_to(device) if e.code == "transfer_failed"]
        assert refused == [], refused
    second = [e for e in fed.errors_to(ATTACKER) if "one upload per device" in e.reason]
    assert len(second) >= 7  # the attacker's own later manifests, refused to it


def test_chunk_requests_are_answered_a_few_times_per_device_and_version(
    tmp_path: Path,
) -> None:
    asked = 5 * DEFAULT_MAX_CHUNK_REQUESTS

    def strike(fed: Federation) -> None:
        tid = model_transfer_id(FEDERATION, "classifier", 0)
        for _ in range(asked):
            request = ChunkRequest(
                federation=FEDERATION,
                round=fed.coordinator.state.round,
                sender=ATTACKER,
                transfer_id=tid,
                indices=(0,),
            )
            fed.send_as(ATTACKER, request)

    fed, plugin = _round_with(tmp_path, strike)

    _honest_round(fed, plugin)
    down = f"/dev/{ATTACKER}/down/"
    answered = [m for t, m in fed.messages("chunk") if down in t]
    assert 0 < len(answered) <= DEFAULT_MAX_CHUNK_REQUESTS  # not `asked`
    limits = ("per device and version", "at most one per")  # budget, interval
    refused = [e for e in fed.errors_to(ATTACKER) if any(w in e.reason for w in limits)]
    assert len(refused) >= asked - DEFAULT_MAX_CHUNK_REQUESTS
    for device in HONEST:  # an honest device's download is not held back
        assert fed.devices[device].model_version is not None


def _empty_arrays(count: int) -> bytes:
    """A float32 payload declaring ``count`` empty arrays (11 bytes each)."""
    header = MAGIC + struct.pack("<BBHI", 1, 1, 0, count)
    entry = [
        struct.pack("<H5sBI", 5, b"%05d" % (i % 100_000), 1, 0) for i in range(count)
    ]
    return header + b"".join(entry)


def _huge_shape(*, with_b: bool = False) -> bytes:
    """An array "w" of shape (2^32 - 1, 2^32 - 1), ~2^64 values, in 64 bytes
    (``with_b``: then "b" of shape (2,), as the test model has)."""
    header = MAGIC + struct.pack("<BBHI", 1, 1, 0, 2 if with_b else 1)
    huge = struct.pack("<H1sBII", 1, b"w", 2, 2**32 - 1, 2**32 - 1)
    b = struct.pack("<H1sBI", 1, b"b", 1, 2) if with_b else b""
    return header + huge + b + bytes(64)


@pytest.mark.parametrize(
    ("weights", "reason"),
    [
        (_empty_arrays(80_000), "80000 arrays declared, expected 2"),
        (
            _huge_shape(with_b=True),
            "shape (4294967295, 4294967295), expected (3,)",
        ),
    ],
    ids=["80000-empty-arrays", "shape-2^64"],
)
def test_weight_headers_that_declare_too_much_are_refused_unread(
    tmp_path: Path, weights: bytes, reason: str
) -> None:
    def strike(fed: Federation) -> None:
        update = ModelUpdate(
            federation=FEDERATION,
            round=fed.coordinator.state.round,
            sender=ATTACKER,
            base_version=0,
            num_examples=10,
            weights=weights,
        )
        fed.send_as(ATTACKER, update)

    fed, plugin = _round_with(tmp_path, strike)

    _honest_round(fed, plugin)
    refused = [e.reason for e in fed.errors_to(ATTACKER) if e.code == "malformed"]
    assert len(refused) == 1, refused
    assert reason in refused[0]


# --- the decoder against the expected spec, over malformed headers -------------

TEMPLATE = {
    "w": np.zeros((3, 2), np.float32),
    "b": np.zeros(2, np.float32),
    "n": np.zeros((), np.int64),
}
GOOD = arrays_to_bytes(TEMPLATE)


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    """Payloads near a valid one: header fields, entry tables and data mutated."""
    count = draw(st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1)))
    version = draw(st.sampled_from([1, 2, 2, 3]))
    code = draw(st.sampled_from([1, 2, 1, 9]))
    entries = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from([b"w", b"b", b"n", b"x", b"\xff"]))
        ndim = draw(st.sampled_from([0, 1, 2, 3, 40, 255]))
        dims = draw(
            st.lists(
                st.one_of(st.integers(0, 4), st.integers(0, 2**32 - 1)),
                min_size=min(ndim, 4),
                max_size=min(ndim, 4),
            )
        )
        kind = bytes([draw(st.sampled_from([1, 3, 7]))]) if version == 2 else b""
        packed = struct.pack(f"<{len(dims)}I", *dims)
        entries.append(
            struct.pack("<H", len(name)) + name + kind + bytes([ndim]) + packed
        )
    data = draw(st.binary(max_size=96))
    out = MAGIC + struct.pack("<BBHI", version, code, 0, count) + b"".join(entries)
    return out + data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.one_of(headers(), st.binary(max_size=64)))
def test_any_header_is_a_typed_error_or_the_expected_arrays(payload: bytes) -> None:
    try:
        arrays = arrays_from_bytes(payload, TEMPLATE)
    except WeightsError:
        return
    assert list(arrays) == list(TEMPLATE)
    for name, template in TEMPLATE.items():
        assert arrays[name].shape == template.shape
    assert sum(a.nbytes for a in arrays.values()) <= 8 * len(payload)


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, len(GOOD) - 1), flip=st.integers(0, 255))
def test_a_damaged_payload_never_raises_anything_else(cut: int, flip: int) -> None:
    damaged = GOOD[:cut] + bytes([GOOD[cut] ^ flip]) + GOOD[cut + 1 :]
    for payload in (GOOD[:cut], damaged):
        with contextlib.suppress(WeightsError):
            arrays_from_bytes(payload, TEMPLATE)


def test_declared_counts_and_shapes_are_refused_with_typed_errors() -> None:
    with pytest.raises(WeightsSpecError, match="80000 arrays declared, expected 3"):
        arrays_from_bytes(_empty_arrays(80_000), TEMPLATE)
    with pytest.raises(WeightsFormatError, match="more than"):
        arrays_from_bytes(_empty_arrays(80_000))  # no spec: MAX_ARRAYS
    with pytest.raises(WeightsFormatError, match="truncated"):
        arrays_from_bytes(_huge_shape())
    with pytest.raises(WeightsSpecError, match="expected"):
        arrays_from_bytes(_huge_shape(), {"w": np.zeros(3, np.float32)})
    assert list(arrays_from_bytes(GOOD, TEMPLATE)) == ["w", "b", "n"]


# --- a real Mosquitto with the generated config -----------------------------------

QUEUE_CAP = 8 * MIB
"""The broker's max_queued_bytes in these runs (the generated default is
128 MiB; a small one keeps the run short, the mechanism is the same)."""


@pytest.fixture
def broker(mosquitto_binary: Path, tmp_path: Path) -> Iterator[MosquittoBroker]:
    made = MosquittoBroker(
        devices=[ATTACKER, *HONEST],
        readers=[OBSERVER],
        binary=mosquitto_binary,
        work_dir=tmp_path / "mosquitto",
        max_queued_bytes=QUEUE_CAP,
    )
    with made:
        yield made


class _Inbox:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, int]] = []

    def __call__(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.items.append((topic, len(payload)))

    def bytes_from(self, device: str) -> int:
        with self.lock:
            return sum(n for t, n in self.items if f"/dev/{device}/" in t)


def _connect(broker: MosquittoBroker, user: str, **update: Any) -> MqttTransport:
    config = broker.mqtt_config(user).model_copy(
        update={"keepalive_s": 5, "timeout_s": 10.0, **update}
    )
    transport = MqttTransport(config)
    transport.connect()
    return transport


def _settle(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.integration
def test_a_flood_queued_for_the_offline_coordinator_is_capped_in_bytes(
    broker: MosquittoBroker,
) -> None:
    up_filter = f"ursa/v1/{FEDERATION}/dev/+/up/#"
    session = _connect(broker, "coordinator")  # a persistent session
    session.subscribe(up_filter)
    session.close()  # the coordinator is offline; the broker queues for it
    honest = _connect(broker, HONEST[0])
    honest.publish(up_topic(FEDERATION, HONEST[0], "control"), b"h" * 100)
    honest.flush()
    attacker = _connect(broker, ATTACKER)
    sent = 0
    for _ in range(24):
        attacker.publish(up_topic(FEDERATION, ATTACKER, "control"), b"x" * MIB)
        sent += MIB
    attacker.flush()

    inbox = _Inbox()
    back = MqttTransport(
        broker.mqtt_config("coordinator").model_copy(update={"timeout_s": 10.0})
    )
    back.set_handler(inbox)
    back.subscribe(up_filter)
    back.connect()
    _settle(lambda: inbox.bytes_from(HONEST[0]) > 0)
    time.sleep(1.0)  # whatever else the broker still has for it
    back.close()
    honest.close()
    attacker.close()

    redelivered = inbox.bytes_from(ATTACKER)
    assert inbox.bytes_from(HONEST[0]) == 100  # queued before the flood: kept
    assert redelivered <= QUEUE_CAP + MIB, (redelivered, sent)
    assert redelivered < sent


@pytest.mark.integration
def test_retained_messages_on_a_devices_up_topics_are_cleared_by_the_coordinator(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    attacker = _connect(broker, ATTACKER)
    for name in ("control", "transfer", "model"):
        topic = up_topic(FEDERATION, ATTACKER, name)
        attacker.publish(topic, b"r" * MIB, retain=True)
    deep = f"{up_topic(FEDERATION, ATTACKER, 'control')}/many/levels"
    attacker.publish(deep, b"r" * MIB, retain=True)  # outside the ACL: dropped
    honest = _connect(broker, HONEST[0])
    honest.publish(status_topic(FEDERATION, HONEST[0]), b"online", retain=True)
    attacker.flush()
    honest.flush()
    assert len(_retained(broker)) == 4  # three up topics and a status

    config = CoordinatorConfig(
        federation=FEDERATION,
        state_dir=tmp_path / "coordinator",
        broker=CoordinatorBroker(
            url=f"mqtt://127.0.0.1:{broker.port}",
            username="coordinator",
            password=broker.credentials["coordinator"],
            keepalive_s=5,
        ),
        enrolment=EnrolmentConfig(mode="tofu"),
        min_devices=3,
        k=3,
        key_bits=1024,
    )
    now = [time.time()]
    coordinator = CoordinatorService(config, clock=lambda: now[0])
    coordinator.start()
    try:
        _settle(lambda: coordinator.retained_cleared >= 3, timeout_s=90.0)
        # counted when seen; the clearing publishes may still be on their way,
        # and one landing after the next retained message would delete it
        status_only = {status_topic(FEDERATION, HONEST[0])}
        _settle(lambda: set(_retained(broker)) == status_only, timeout_s=90.0)
        attacker.publish(
            up_topic(FEDERATION, ATTACKER, "control"), b"again", retain=True
        )
        attacker.flush()

        def swept() -> bool:  # each sweep's tick: the broker may store it late
            if coordinator.retained_cleared >= 4:
                return True
            now[0] += RETAINED_SWEEP_S
            coordinator.tick()
            time.sleep(0.5)  # the re-subscription's retained delivery, under load
            return coordinator.retained_cleared >= 4

        _settle(swept, timeout_s=90.0)  # a wait, not a timing claim: busy CI hosts
        time.sleep(0.5)
        left = _retained(broker)
    finally:
        coordinator.stop()
        attacker.close()
        honest.close()

    assert coordinator.retained_cleared == 4
    assert set(left) == {status_topic(FEDERATION, HONEST[0])}  # honest: kept


def _retained(broker: MosquittoBroker) -> dict[str, int]:
    """Topic -> size of every retained message under the federation now."""
    inbox = _Inbox()
    reader = MqttTransport(
        broker.mqtt_config(OBSERVER).model_copy(update={"clean_start": True})
    )
    reader.set_handler(inbox)
    reader.connect()
    reader.subscribe(f"ursa/v1/{FEDERATION}/#")
    time.sleep(0.5)
    reader.close()
    with inbox.lock:
        return {t: n for t, n in inbox.items if n and "/dev/" in t}
