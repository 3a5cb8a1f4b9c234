"""Devices and coordinator over a real Mosquitto with password file and ACL."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.store import DB_FILENAME
from ursa.crypto.encoding import PackingLayout, pack
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import PaillierSecretKey
from ursa.edge_sdk.registration import registry_indices, registry_vector
from ursa.protocol.codebook import Codebook
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import Volunteer
from ursa.protocol.topics import up_topic

from .conftest import serve_coordinator

pytestmark = pytest.mark.integration

N = 30
K = 5
H = 5
ROUNDS = 5


def _run_coordinator(config: Any) -> tuple[CoordinatorService, threading.Thread]:
    service = CoordinatorService(config)
    service.start()
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    return service, thread


def _check_rounds(fed: Any, coordinator_identity: Any, rounds: int, k: int) -> dict:
    """Every round selected exactly K once (re-publications carry the same id)."""
    by_round: dict[int, Any] = {}
    for _, result in fed.capture.messages("selection_result"):
        verify_signature(coordinator_identity, signing_bytes(result), result.signature)
        assert len(result.selected) == k
        earlier = by_round.setdefault(result.round, result)
        assert earlier.message_id == result.message_id, "round selected twice"
    assert sorted(by_round) == list(range(1, rounds + 1))
    return by_round


def test_thirty_devices_five_rounds_of_five_tries_each_exactly_k(
    mqtt_federation: Any, connect_mqtt: Any
) -> None:
    fed = mqtt_federation("itfull")
    service, thread = _run_coordinator(fed.coordinator_config(N, rounds=ROUNDS))
    fed.start_devices(N)

    thread.join(timeout=60)
    assert service.is_done, f"stuck at {service.state}"
    _check_rounds(fed, service.identity, ROUNDS, K)
    assert len(fed.capture.messages("agent_answer")) >= ROUNDS
    (_, registry_sum), *_ = fed.capture.messages("registry_sum")
    assert registry_sum.num_parties == N
    assert all(c.has_registry for c in fed.clients.values())

    # The ACL stops a device publishing under another device's subtree ...
    outsider = connect_mqtt(fed.broker, "dev050")
    forged = Volunteer(federation="itfull", round=1, sender="dev001", draws=(True,) * H)
    outsider.publish(up_topic("itfull", "dev001", "control"), encode(forged))
    # ... and a device naming another as sender on its own topic is refused.
    outsider.publish(up_topic("itfull", "dev050", "control"), encode(forged))
    fed.capture.wait_for(
        lambda: any("/dev/dev050/" in t for t, _ in fed.capture.items), 5, "dev050"
    )
    topics = [t for t, _ in fed.capture.items]
    assert up_topic("itfull", "dev050", "control") in topics
    forged_seen = [
        t
        for t, m in fed.capture.messages("volunteer")
        if m.message_id == forged.message_id
    ]
    assert forged_seen == [up_topic("itfull", "dev050", "control")]


def test_rounds_complete_with_exactly_k_after_thirty_percent_die(
    mqtt_federation: Any,
) -> None:
    fed = mqtt_federation("itkill")
    # 9 of 30 die for good: the operator's quorum lets the fleet go on without them
    config = fed.coordinator_config(N, rounds=ROUNDS, quorum=N - 9)
    service, thread = _run_coordinator(config)
    clients = fed.start_devices(N)
    fed.capture.wait_for(
        lambda: all(c.has_registry for c in clients), 30, "every registry decrypted"
    )
    agent = fed.capture.messages("key_epoch_start")[0][1].agent
    rng = np.random.default_rng(5)
    others = [c for c in clients if c.device_id != agent]
    doomed = [fed.clients[agent], *list(rng.choice(others, size=8, replace=False))]
    dead = {c.device_id for c in doomed}

    def wills_seen() -> bool:
        offline = {m.sender for _, m in fed.capture.messages("status") if not m.online}
        return dead <= offline

    with service._lock:  # pause the coordinator: kills land between two stages
        time.sleep(0.3)  # let anything it already published be answered
        killers = [threading.Thread(target=c.transport.kill) for c in doomed]
        for killer in killers:  # abrupt: the broker publishes each last will
            killer.start()
        for killer in killers:
            killer.join()
        fed.capture.wait_for(wills_seen, 10, "the last wills")
        mark = len(fed.capture.items)

    thread.join(timeout=60)
    assert service.is_done, f"stuck at {service.state}"
    results = _check_rounds(fed, service.identity, ROUNDS, K)
    later = {m.round for _, m in _decoded(fed.capture.items[mark:], "round_announce")}
    assert len(later) >= 2, "too few rounds after the kills to test"
    for round_index in later:
        chosen = set(results[round_index].selected)
        assert not chosen & dead, f"round {round_index} chose a dead device"
    epochs = [m for _, m in fed.capture.messages("key_epoch_start")]
    assert epochs[-1].epoch >= 2 and epochs[-1].agent not in dead  # agent replaced


def _decoded(items: list[tuple[str, bytes]], kind: str) -> list[tuple[str, Any]]:
    out = []
    for topic, payload in items:
        try:
            message = decode(payload)
        except ProtocolError:
            continue
        if message.kind == kind:
            out.append((topic, message))
    return out


def _needles(fed: Any, secret_key: PaillierSecretKey) -> dict[str, list[bytes]]:
    """Every encoding of device secrets the code uses, as searchable byte strings.

    Kept: needles of 8+ bytes with 4+ distinct byte values. A one-hot
    registry's packed plaintext in raw big-endian bytes is one non-zero byte
    followed by zeros (likewise its hex form and the vector's int64 bytes):
    that pattern fills every zeroed database page, so it cannot be searched;
    its decimal form and the vector's JSON/msgpack forms are.
    """
    codebook = Codebook(10, (1, 2, 10))
    layout = PackingLayout(1, 10_000, secret_key.public_key.key_bits)
    found: dict[str, list[bytes]] = {"histogram": [], "registry": [], "secret_key": []}
    for client in fed.clients.values():
        counts = np.bincount(client.data.labels, minlength=10)
        dist = counts / counts.sum()
        as_list = [int(c) for c in counts]
        found["histogram"] += [
            json.dumps(as_list).encode(),
            str(as_list).encode(),
            msgpack.packb(as_list),
            counts.astype(np.int64).tobytes(),
            dist.tobytes(),
            msgpack.packb([float(x) for x in dist]),
            json.dumps([float(x) for x in dist]).encode(),
        ]
        index = int(
            registry_indices(dist[None, :], codebook, {1: 0.7, 2: 0.1, 10: 0.0})[0]
        )
        one_hot = registry_vector(index, codebook)
        (plaintext,) = pack(layout, one_hot.tolist())
        width = (plaintext.bit_length() + 7) // 8
        found["registry"] += [
            json.dumps(one_hot.tolist()).encode(),
            msgpack.packb(one_hot.tolist()),
            one_hot.tobytes(),
            str(plaintext).encode(),
            f"{plaintext:x}".encode(),
            plaintext.to_bytes(width, "big"),
        ]
    raw = secret_key.secret_to_bytes()
    found["secret_key"] += [raw, raw.hex().encode(), msgpack.packb(raw)]
    for prime in (secret_key._p, secret_key._q):
        prime = int(prime)
        found["secret_key"] += [
            str(prime).encode(),
            f"{prime:x}".encode(),
            f"{prime:X}".encode(),
            prime.to_bytes((prime.bit_length() + 7) // 8, "big"),
        ]
    return {
        k: [n for n in v if len(n) >= 8 and len(set(n)) >= 4] for k, v in found.items()
    }


def _assert_no_secrets(
    haystacks: dict[str, bytes], needles: dict[str, list[bytes]]
) -> None:
    for where, data in haystacks.items():
        assert data, f"nothing captured in {where}"
        for what, items in needles.items():
            for needle in items:
                assert needle not in data, f"{what} found in {where}"


def test_coordinator_killed_mid_round_resumes_and_leaks_nothing(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    rounds = 6
    fed = mqtt_federation("itrestart")
    base = fed.coordinator_config(N, rounds=rounds)
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(
        f'federation = "itrestart"\nstate_dir = "{base.state_dir}"\n'
        f"min_devices = {N}\nk = {K}\ntries = {H}\nrounds = {rounds}\n"
        f"key_bits = {base.key_bits}\ninsecure_test_keys = true\n"
        f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
        '[enrolment]\nmode = "tofu"\n'
        "[deadlines]\nvolunteer_s = 5\ndistributions_s = 5\nagent_s = 5\n"
    )
    env = dict(os.environ, URSA_BROKER__PASSWORD=fed.broker.credentials["coordinator"])
    log_path = tmp_path / "coordinator.log"

    def spawn() -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = serve_coordinator(config_file, env, log_path)
        return process

    process = spawn()
    killed = threading.Event()

    def kill_in_round_three(topic: str, message: Any) -> None:
        if (
            message.kind == "try_assignment"
            and message.round == 3
            and not killed.is_set()
        ):
            killed.set()
            os.kill(process.pid, signal.SIGKILL)

    fed.capture.on_message = kill_in_round_three
    try:
        fed.start_devices(N)
        fed.capture.wait_for(killed.is_set, 60, "round 3's try assignments")
        process.wait(timeout=10)
        assert process.returncode == -signal.SIGKILL
        db = base.state_dir / DB_FILENAME
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            enrolled_before = conn.execute("SELECT * FROM devices").fetchall()
            state = json.loads(
                conn.execute("SELECT value FROM meta WHERE key='state'").fetchone()[0]
            )
            completed = conn.execute("SELECT round FROM rounds WHERE completed=1")
            completed_before = [r[0] for r in completed.fetchall()]
        assert state["round"] == 3 and completed_before == [1, 2], "not mid-round 3"

        process = spawn()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT * FROM devices").fetchall() == enrolled_before
        completed = [
            r[0] for r in conn.execute("SELECT round FROM rounds WHERE completed=1")
        ]
    assert completed == list(range(1, rounds + 1))
    assert len(fed.capture.messages("enrol_result")) == N  # nobody enrolled again
    assert {m.epoch for _, m in fed.capture.messages("key_epoch_start")} == {1}
    log_text = log_path.read_text()
    assert "resumed at stage" in log_text
    identity_hex = (base.state_dir / "coordinator.pub").read_text().split()[0]
    from ursa.crypto.identity import DevicePublicIdentity

    identity = DevicePublicIdentity.from_bytes(bytes.fromhex(identity_hex))
    _check_rounds(fed, identity, rounds, K)

    # No device secret in the traffic, the coordinator's database or its log.
    secret_key = fed.clients["dev000"].link.store.load_secret_key(1)
    assert secret_key is not None
    needles = _needles(fed, secret_key)
    assert all(needles.values())
    with fed.capture.lock:
        traffic = b"\x00".join(p for _, p in fed.capture.items)
    database = b"".join(
        p.read_bytes()
        for p in base.state_dir.iterdir()
        if p.name.startswith(DB_FILENAME)
    )
    _assert_no_secrets(
        {"traffic": traffic, "database": database, "log": log_path.read_bytes()},
        needles,
    )
    # and the needles are real: the device's own key file holds the key.
    key_file = fed.clients["dev000"].link.store.secret_key_path(1).read_bytes()
    assert any(n in key_file for n in needles["secret_key"])
