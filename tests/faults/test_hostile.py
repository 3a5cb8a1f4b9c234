"""Hostile input over real processes: a flood and malformed messages (issue 14).

A rogue session holds the broker credentials of a device identity no process
runs (`ROGUE`: the ACL lets it write its own ``up`` and ``status`` topics
only) and publishes while the fleet trains. Judged as `test_scenarios`: every
round complete with K updates (the aggregate is the honest devices'), nobody
counted twice, accuracy within `TOLERANCE` of the fault-free run, no crash.

Only the coordinator's topics are attacked here: a device reads its ``down``
and the ``global`` topics, which the ACL lets only the coordinator's broker
user write, and Mosquitto takes a client id from its username, so a second
session as the coordinator would unseat the real one. Hostile input to a
device is covered in process (tests/edge_sdk, the fuzzing in tests/protocol).
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from ursa.lab.faults import OBSERVER, ROGUE, RunOutcome
from ursa.lab.faults.hostile import flood, malformed_payloads
from ursa.protocol.topics import status_topic, up_topic

from .conftest import MakeFleet, assert_recovered, run_to_end, start

pytestmark = [pytest.mark.integration, pytest.mark.faults]

MAX_MESSAGE_BYTES = 256 * 1024
"""The coordinator's cap in the malformed-input run: below the broker's
packet limit, so an oversized payload reaches the coordinator's admission."""
BURST = 300
"""The coordinator's admission burst in the flood run: the flood overruns it
whatever the machine's speed, an honest device never comes near it."""
REPLAYS = 60
PACE_S = 0.02
"""Between two malformed publishes: under the rate limit, so every one is
decoded and judged rather than dropped unread."""


def test_a_flood_from_one_devices_credentials_leaves_the_rounds_alone(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    run = fleet(admission_burst=BURST)
    rogue = run.connect(ROGUE)
    stop = threading.Event()
    sent: list[int] = []
    flooding = threading.Thread(
        target=lambda: sent.append(flood(rogue, run.name, ROGUE, stop)),
        name="flood",
        daemon=True,
    )
    flooding.start()
    try:
        start(run)
        outcome = run_to_end(run)
    finally:
        stop.set()
        flooding.join(timeout=30)

    assert_recovered(outcome, baseline)
    reports = re.findall(
        rf"dropping messages from {ROGUE} over the admission limits .*?: "
        r"(\d+) dropped since the last report",
        run.log(),
    )
    dropped = sum(map(int, reports))
    assert dropped > 1000, reports  # counted and logged, not decoded
    assert sent and sent[0] > dropped
    assert not re.search(r"dropping messages from d\d\d ", run.log())


def test_malformed_input_on_the_coordinators_topics_changes_nothing(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    run = fleet(max_message_bytes=MAX_MESSAGE_BYTES)
    captured: list[tuple[str, bytes]] = []
    run.connect(
        OBSERVER,
        [f"ursa/v1/{run.name}/#"],
        on_message=lambda topic, payload: captured.append((topic, payload)),
    )
    start(run)
    run.wait_for_log(r"round 1: update 1/")
    # Silence means no: fewer messages precede the first update than before,
    # so wait (bounded) for the round's traffic to give REPLAYS of them.
    deadline = time.monotonic() + 60
    while sum(1 for _, p in captured if p) < REPLAYS and time.monotonic() < deadline:
        time.sleep(0.1)
    rogue = run.connect(ROGUE)
    replays = [payload for _, payload in captured if payload][:REPLAYS]
    cases = malformed_payloads(
        run.name, ROGUE, oversize_bytes=2 * MAX_MESSAGE_BYTES, replays=replays
    )
    topics = (
        up_topic(run.name, ROGUE, "control"),
        up_topic(run.name, ROGUE, "update"),
        status_topic(run.name, ROGUE),
    )
    for _, payload in cases:
        for topic in topics:
            rogue.publish(topic, payload, qos=1)
            time.sleep(PACE_S)

    outcome = run_to_end(run)

    assert_recovered(outcome, baseline)
    assert len(replays) == REPLAYS
    rejected = re.findall(rf"rejected \S+ from {ROGUE}: (\w+)", run.log())
    assert {"oversize", "malformed"} <= set(rejected), set(rejected)
    assert "enrolled r00" not in run.log()
