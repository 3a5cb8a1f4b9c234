"""Per-device admission limits: a flood from one device's credentials is dropped."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.training import TrainingConfig
from ursa.models.weights import arrays_to_bytes
from ursa.protocol.admission_limits import AdmissionLimits, DropReason
from ursa.protocol.envelope import decode, encode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import Heartbeat, ModelUpdate, SelectionResult
from ursa.protocol.topics import name_for, up_topic

from .test_training import INITIAL, fedavg_oracle, selections, start_training

FED = "fed"
FLOOD = 3000
LIMITS = AdmissionLimits(messages_per_s=5.0, burst=200)

PLAIN = AggregationConfig(mode="plain")
"""These tests check the plain path's wire (updates in the clear, by design)."""


def _flood(device_id: str, round_index: int) -> list[tuple[str, bytes]]:
    """Valid-looking messages from ``device_id``: updates with a huge delta, pings."""
    poison = arrays_to_bytes({k: np.full_like(v, 1e6) for k, v in INITIAL.items()})
    out = []
    for i in range(FLOOD):
        message: Any
        if i % 2:
            message = Heartbeat(
                federation=FED, round=round_index, sender=device_id, seq=i
            )
        else:
            message = ModelUpdate(
                federation=FED,
                round=round_index,
                sender=device_id,
                base_version=0,
                num_examples=1_000_000,
                weights=poison,
            )
        out.append((up_topic(FED, device_id, name_for(message.kind)), encode(message)))
    return out


def test_a_flood_from_one_device_is_dropped_and_the_round_completes_unchanged(
    federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=2, admission=LIMITS)
    flooders: list[str] = []
    flooder = InMemoryTransport(fed.bus, "flooder")

    def on_message(topic: str, payload: bytes) -> None:
        try:
            message = decode(payload)
        except ProtocolError:
            return
        if not isinstance(message, SelectionResult) or message.round != 1:
            return
        if flooders:
            return
        # the credentials of a device that is enrolled but not training now
        victim = next(d for d in fed.device_ids if d not in message.selected)
        flooders.append(victim)
        for topic_out, data in _flood(victim, message.round):
            flooder.publish(topic_out, data)

    flooder.set_handler(on_message)
    flooder.subscribe(f"ursa/v1/{FED}/global/#")
    flooder.connect()
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    plugin = start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN))
    for _ in range(30):  # the flooder's own volunteer for round 2 was dropped too:
        if fed.coordinator.is_done:  # its window runs to the deadline
            break
        fed.tick(1.0)

    assert flooders, "the flood never started"
    (victim,) = flooders
    assert fed.coordinator.is_done and plugin.version == 2
    chosen = selections(fed)
    assert [r.contributed for r in plugin.history] == [chosen[1], chosen[2]]
    assert victim not in chosen[1]
    expected = fedavg_oracle(fed, 2)
    for name, value in plugin.global_arrays.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    stats = fed.coordinator.admission_stats()
    assert set(stats.dropped_by_sender) == {victim}
    assert stats.dropped[DropReason.RATE] >= FLOOD - LIMITS.burst
    assert stats.dropped[DropReason.OVERSIZE] == 0
    lines = [r for r in caplog.records if "dropping messages from" in r.getMessage()]
    assert len(lines) == 1 and victim in lines[0].getMessage()


def test_default_limits_pass_a_whole_run_with_chunked_uploads(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=2)

    def small_chunks(client: Any) -> None:
        client.training.uploads.inline_limit = 1
        client.training.uploads.chunk_size = (
            1  # one chunk per byte: ~50 per upload, all at once
        )

    plugin = start_training(
        fed,
        tmp_path,
        TrainingConfig(aggregation=PLAIN, chunk_size=1024),
        prepare=small_chunks,
    )

    assert fed.coordinator.is_done and plugin.version == 2
    up_chunks = [t for t, _ in fed.messages("chunk") if "/up/" in t]
    assert len(up_chunks) >= 2 * 3 * 40
    assert fed.coordinator.admission_stats().total_dropped() == 0
    for client in fed.devices.values():
        assert client.admission_stats().total_dropped() == 0


def test_oversize_messages_are_answered_once_per_window_and_counted(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=3, k=1, rounds=1, max_message_bytes=4096)
    fed.start()
    d0 = fed.device_ids[0]
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    for _ in range(50):
        fed.raw.publish(f"ursa/v1/{FED}/dev/{d0}/up/control", b"\x00" * 5000)
    fed.tick(11.0)
    fed.raw.publish(f"ursa/v1/{FED}/dev/{d0}/up/control", b"\x00" * 5000)

    assert [e.code for e in fed.errors_to(d0)] == ["oversize", "oversize"]
    stats = fed.coordinator.admission_stats()
    assert stats.dropped_by_sender == {d0: {DropReason.OVERSIZE: 51}}
    assert "50 dropped since the last report" in caplog.text
