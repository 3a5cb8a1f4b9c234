"""Group commit over a real Mosquitto: a ``kill -9`` mid-batch, and the refill.

The coordinator (``ursa coordinator serve``, a subprocess) commits its store
in long batches here. Half the devices hold back their round-2 volunteers.
Silence means no: the window closes early only once each of the H = 8 tries
has K yes-volunteers, which the other three devices almost never give
(about 2 in 10^5), so the window stays open while their volunteers sit in the
open batch; the coordinator is killed then. The restarted coordinator
re-announces round 2, the devices volunteer again with the same message ids
(their stored draws), and the federation completes with every round selected
exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from ursa.coordinator.store import DB_FILENAME
from ursa.crypto.identity import DevicePublicIdentity, verify_signature
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import BaseMessage

from .conftest import serve_coordinator

pytestmark = pytest.mark.integration

N = 6
K = 2
H = 8
HELD = 3
ROUNDS = 3


_ROUND_2_VOLUNTEERS = (
    "SELECT device_id FROM method_rows "
    "WHERE method = 'dubhe' AND key = 'volunteers.2'"
)
"""Dubhe's volunteers of round 2 (`ursa.coordinator.methods.dubhe.records`)."""


def _read(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


def _admitted_volunteers(log_path: Path, round_index: int) -> set[str]:
    marker = f"volunteer of round {round_index} from "
    return {
        line.split(marker)[1].split()[0]
        for line in log_path.read_text().splitlines()
        if marker in line
    }


def test_a_kill_mid_batch_is_refilled_by_the_devices_retransmissions(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("itbatch")
    base = fed.coordinator_config(N, rounds=ROUNDS)
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(
        f'federation = "itbatch"\nstate_dir = "{base.state_dir}"\n'
        f"min_devices = {N}\nk = {K}\ntries = {H}\nrounds = {ROUNDS}\n"
        f"key_bits = {base.key_bits}\ninsecure_test_keys = true\n"
        f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
        '[enrolment]\nmode = "tofu"\n'
        "[deadlines]\nvolunteer_s = 20\ndistributions_s = 10\nagent_s = 10\n"
        "[store]\ncommit_interval_s = 60\ncommit_max_records = 100000\n"
    )
    env = dict(os.environ, URSA_BROKER__PASSWORD=fed.broker.credentials["coordinator"])
    log_path = tmp_path / "coordinator.log"
    db = base.state_dir / DB_FILENAME

    process: subprocess.Popen[bytes] = serve_coordinator(config_file, env, log_path)
    try:
        clients = fed.start_devices(N)
        held = set(fed.device_ids(N)[-HELD:])
        release = threading.Event()

        def holding(client: Any) -> Any:
            send = client.link.send

            def hold_round_two_volunteer(message: BaseMessage) -> None:
                round_two = message.kind == "volunteer" and message.round == 2
                if round_two and not release.is_set():
                    return  # keeps round 2's window open
                send(message)

            return hold_round_two_volunteer

        for client in clients[-HELD:]:
            client.link.send = holding(client)

        def handled() -> bool:
            sent = {
                m.sender for _, m in fed.capture.messages("volunteer") if m.round == 2
            }
            admitted = _admitted_volunteers(log_path, 2)
            return bool(admitted) and admitted >= sent

        fed.capture.wait_for(handled, 120, "round 2's volunteers handled")
        admitted = _admitted_volunteers(log_path, 2)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=10) == -signal.SIGKILL

        state = json.loads(_read(db, "SELECT value FROM meta WHERE key='state'")[0][0])
        committed = _read(db, _ROUND_2_VOLUNTEERS)
        assert state["round"] == 2
        assert not held & admitted
        assert len(committed) < len(admitted), "the batch was committed before the kill"
        assert _read(db, "SELECT round FROM rounds WHERE completed = 1") == [(1,)]

        release.set()
        process = serve_coordinator(config_file, env, log_path)
        assert process.wait(timeout=180) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    completed = _read(db, "SELECT round FROM rounds WHERE completed = 1 ORDER BY 1")
    assert completed == [(r,) for r in range(1, ROUNDS + 1)]
    refilled = _read(db, _ROUND_2_VOLUNTEERS)
    volunteered = {
        m.sender for _, m in fed.capture.messages("volunteer") if m.round == 2
    }
    assert {d for (d,) in refilled} == volunteered  # the same draws, again
    assert admitted <= volunteered and volunteered & held
    assert len(fed.capture.messages("enrol_result")) == N  # nobody enrolled again
    identity_hex = (base.state_dir / "coordinator.pub").read_text().split()[0]
    identity = DevicePublicIdentity.from_bytes(bytes.fromhex(identity_hex))
    by_round: dict[int, Any] = {}
    for _, result in fed.capture.messages("selection_result"):
        verify_signature(identity, signing_bytes(result), result.signature)
        assert len(result.selected) == K
        earlier = by_round.setdefault(result.round, result)
        assert earlier.message_id == result.message_id, "a round selected twice"
    assert sorted(by_round) == list(range(1, ROUNDS + 1))
