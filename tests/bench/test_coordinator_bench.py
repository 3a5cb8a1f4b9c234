"""`ursa bench coordinator`: small runs complete every round; the fleet follows pages.

The runs drive the real coordinator (its SQLite store included) in a fresh
process per size; figures are checked for presence and consistency, never
for time.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from ursa.bench import coordinator as bench
from ursa.bench.coordinator_fleet import SimulatedFleet
from ursa.coordinator.enrolment import device_keys_of
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    KeyEpochStart,
    Registration,
    SealedKeys,
    SealRequest,
)
from ursa.protocol.topics import down_topic, global_topic
from ursa.tools.cli.app import build_parser

KEYS = {
    "devices",
    "key_epoch_cpu_s",
    "coordinator_cpu_s_per_round",
    "coordinator_inbound_per_round",
    "us_per_inbound_message",
    "rss_mib",
}


def _run(
    sizes: list[int],
    *,
    all_volunteer: bool = False,
    explicit_replies_below: int | None = None,
) -> dict[str, Any]:
    out = io.StringIO()
    bench.run(
        as_json=True,
        devices=sizes,
        k=5,
        tries=3,
        key_bits=512,
        all_volunteer=all_volunteer,
        explicit_replies_below=explicit_replies_below,
        timeout_s=300,
        out=out,
    )
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def test_a_small_run_completes_three_rounds_at_each_size() -> None:
    report = _run([50, 100], explicit_replies_below=0)

    runs = report["runs"]
    assert [r["devices"] for r in runs] == [50, 100]
    for figures in runs:
        assert set(figures) >= KEYS, figures
        assert figures["rounds_completed"] == 3
        assert figures["selected_per_round"] == [5, 5, 5]
        assert figures["key_epochs"] == 1
        assert figures["registry_parties"] == figures["devices"]
        assert figures["admission_drops"] == 0
        assert figures["device_errors"] == {}
        assert "error" not in figures
        assert figures["key_epoch_cpu_s"] > 0
        assert figures["coordinator_inbound_per_round"] > 0
        assert figures["rss_mib"] > 0
        # silence means no: a volunteer has a True draw, so fewer than all answer
        volunteers = figures["volunteers_drawn_per_round"]
        assert all(0 < v < figures["devices"] for v in volunteers)
        assert figures["replies"] == "silence"
    assert {"cpu_per_round_ratio", "us_per_inbound_ratio"} <= set(report["targets"])


def test_a_fleet_under_the_default_threshold_answers_every_announce() -> None:
    report = _run([50])

    (figures,) = report["runs"]
    assert figures["rounds_completed"] == 3
    assert figures["replies"] == "explicit"
    assert figures["volunteers_drawn_per_round"] == [50] * 3
    assert figures["device_errors"] == {}
    # every device answered: no round waited its volunteering window out
    assert figures["round_waits"] == [0, 0, 0]


def test_every_registered_device_answers_with_all_volunteer() -> None:
    report = _run([50], all_volunteer=True)

    for figures in report["runs"]:
        assert figures["rounds_completed"] == 3
        assert figures["volunteers_drawn_per_round"] == [figures["devices"]] * 3


def test_a_size_over_its_time_says_so_and_names_its_phase() -> None:
    result = bench._measure_in_process(
        bench.SizeSettings(devices=50, key_bits=512), timeout_s=0.01
    )

    assert result["devices"] == 50
    assert "timed out after 0 s in phase" in result["error"]


def test_targets_compare_the_largest_size_with_the_smallest() -> None:
    runs = [
        {
            "devices": 100_000,
            "rounds_completed": 3,
            "coordinator_cpu_s_per_round": 0.6,
            "coordinator_inbound_per_round": 210.0,
            "us_per_inbound_message": 300.0,
            "replies": "silence",
            "k": 20,
            "tries": 5,
        },
        {
            "devices": 1000,
            "rounds_completed": 3,
            "coordinator_cpu_s_per_round": 0.2,
            "us_per_inbound_message": 200.0,
            "replies": "silence",
        },
        {"devices": 10_000, "error": "timed out after 10 s"},
    ]

    assert bench.targets(runs) == {
        "cpu_per_round_ratio": pytest.approx(3.0),
        "us_per_inbound_ratio": pytest.approx(1.5),
        "round_cpu_s_at_100000": pytest.approx(0.6),
        "inbound_per_2hk_at_100000": pytest.approx(210 / 200),
    }


def test_the_per_message_ratio_compares_sizes_of_the_largest_ones_rule() -> None:
    runs = [
        {
            "devices": size,
            "rounds_completed": 3,
            "coordinator_cpu_s_per_round": 0.1,
            "us_per_inbound_message": us,
            "replies": rule,
        }
        for size, us, rule in (
            (1000, 50.0, "explicit"),
            (10_000, 300.0, "silence"),
            (20_000, 400.0, "silence"),
        )
    ]

    ratios = bench.targets(runs)

    assert ratios["us_per_inbound_ratio"] == pytest.approx(400 / 300)
    del runs[1]  # one size of the largest's rule: no ratio to take
    assert "us_per_inbound_ratio" not in bench.targets(runs)


def test_sizes_parse_and_the_cli_takes_them() -> None:
    assert bench.parse_sizes("1000, 10000,100000") == [1000, 10_000, 100_000]
    with pytest.raises(ValueError):
        bench.parse_sizes("1,1000")
    args = build_parser().parse_args(
        ["bench", "coordinator", "--devices", "50,100", "--key-bits", "1024", "--json"]
    )
    assert args.devices == [50, 100]
    assert args.key_bits == 1024
    assert args.all_volunteer is False


def _notice(fleet: SimulatedFleet, agent: int) -> KeyEpochStart:
    return KeyEpochStart(
        federation=fleet.federation,
        round=0,
        sender=COORDINATOR,
        epoch=1,
        agent=fleet.ids[agent],
        agent_keys=device_keys_of(fleet.public_identity(agent)),
        num_classes=10,
        groups=(1, 2, 10),
        sigma=(0.7, 0.1, 0.0),
        max_parties=10,
        key_bits=512,
        methods=("dubhe",),
    )


def _page(fleet: SimulatedFleet, members: range) -> tuple[str, bytes]:
    request = SealRequest(
        federation=fleet.federation,
        round=0,
        sender=COORDINATOR,
        epoch=1,
        recipients=tuple(device_keys_of(fleet.public_identity(i)) for i in members),
    )
    return down_topic(fleet.federation, fleet.ids[0], "control"), encode(request)


def test_the_agent_answers_each_seal_request_page_for_its_recipients() -> None:
    fleet = SimulatedFleet("bench", 6, pool=2)
    notice = _notice(fleet, agent=0)
    fleet.react(global_topic("bench", "epoch"), encode(notice))

    kind, first = fleet.react(*_page(fleet, range(0, 3)))
    sent = [decode(m.payload) for m in first]
    _, second = fleet.react(*_page(fleet, range(3, 6)))
    later = [decode(m.payload) for m in second]

    assert kind == "seal_request"
    assert isinstance(sent[0], AgentPublicKey)  # once, before the first boxes
    pages = [m for m in sent if isinstance(m, SealedKeys)]  # one per page
    assert [b.recipient for p in pages for b in p.boxes] == [fleet.ids[1], fleet.ids[2]]
    assert [m.sender for m in sent if isinstance(m, Registration)] == [fleet.ids[0]]
    assert [type(m) for m in later] == [SealedKeys]
    assert [
        b.recipient for m in later if isinstance(m, SealedKeys) for b in m.boxes
    ] == [
        fleet.ids[3],
        fleet.ids[4],
        fleet.ids[5],
    ]
