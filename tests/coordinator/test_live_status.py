from __future__ import annotations

import json
from typing import Any

from ursa.coordinator.live_status import service_status
from ursa.coordinator.service import CoordinatorService
from ursa.protocol.messages import Volunteer

from .conftest import FEDERATION


def test_status_counts_a_run_its_devices_messages_and_refusals(
    federation: Any,
) -> None:
    fed = federation(num_devices=5, k=2, tries=2, rounds=3)
    fed.start()
    fed.send_as(
        "zz", Volunteer(federation=FEDERATION, round=1, sender="zz", draws=(True,))
    )
    fed.raw.publish(f"ursa/v1/{FEDERATION}/dev/d00/up/control", b"\xc1junk")

    status = service_status(fed.coordinator)
    doc = status.to_json()
    json.dumps(doc, allow_nan=False)  # strict JSON
    assert doc["stage"] == "done"
    assert (doc["round"], doc["rounds_completed"], doc["rounds_total"]) == (3, 3, 3)
    assert doc["devices"]["enrolled"] == 5 and doc["devices"]["online"] == 5
    assert {d["id"] for d in doc["devices"]["list"]} == set(fed.device_ids)
    assert all(d["last_seen"] is not None for d in doc["devices"]["list"])
    assert doc["methods"] == ["dubhe"]
    messages = status.telemetry.messages
    assert messages[("hello", "in")] == 5
    assert messages[("selection_result", "out")] == 3
    assert messages[("volunteer", "in")] >= 3
    assert doc["rejected"] == {"unknown_device": 1, "malformed": 1}
    assert [r["round"] for r in doc["rounds"]] == [1, 2, 3]
    assert all(len(r["selected"]) == 2 for r in doc["rounds"])
    traffic = doc["traffic"]
    assert traffic["bytes_sent"] > 0 and traffic["bytes_received"] > 0
    assert doc["crypto_s"] > 0  # the registration sums, at least


def test_status_before_start_is_empty_and_after_the_finish_shows_the_run(
    federation: Any,
) -> None:
    fed = federation(num_devices=2, k=1, rounds=1)
    fresh = CoordinatorService(fed.config)
    assert service_status(fresh).to_json()["devices"]["enrolled"] == 0
    fed.start()
    fed.coordinator.stop()  # store and broker link closed: a finished federation
    doc = service_status(fed.coordinator).to_json()
    assert doc["stage"] == "done" and doc["rounds_completed"] == 1
    assert [d["id"] for d in doc["devices"]["list"]] == sorted(fed.device_ids)
    assert doc["devices"]["enrolled"] == 2
    assert (doc["connected"], doc["link"]) == (False, "closed")  # not "down"
    assert sum(d["selected"] for d in doc["devices"]["list"]) == 1
