"""``/metrics`` names the devices in trouble: failing their rounds, sitting out."""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

from tests.tools.observe.statuses import fixed_status
from ursa.coordinator.device_health import DeviceHealth
from ursa.coordinator.live_status import ServiceStatus
from ursa.tools.observe.metrics import metrics_registry, render

MISFIT = "model_mismatch: tensor 'fc.weight': shape (3, 8) here, (10, 8) there"


def _samples(
    status: ServiceStatus,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = render(metrics_registry(lambda: status)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_healthy_fleet_counts_no_device_failing_or_sitting_out() -> None:
    samples = _samples(fixed_status())
    assert samples[("ursa_devices_failing", ())] == 0
    assert samples[("ursa_devices_sitting_out", ())] == 0
    assert not any(n == "ursa_device_failed_rounds_in_a_row" for n, _ in samples)


def test_failing_and_sitting_out_devices_are_counted_and_named() -> None:
    health = DeviceHealth(failing={"d2": 2, "d3": 4}, sitting_out={"d1": MISFIT})
    samples = _samples(dataclasses.replace(fixed_status(), health=health))
    assert samples[("ursa_devices_failing", ())] == 2
    assert samples[("ursa_devices_sitting_out", ())] == 1
    per_device = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "ursa_device_failed_rounds_in_a_row"
    }
    assert per_device == {(("device", "d2"),): 2, (("device", "d3"),): 4}


def test_the_status_document_shows_each_devices_trouble() -> None:
    health = DeviceHealth(failing={"d3": 2}, sitting_out={"d1": MISFIT})
    document = dataclasses.replace(fixed_status(), health=health).to_json()
    devices = {d["id"]: d for d in document["devices"]["list"]}
    assert (document["devices"]["failing"], document["devices"]["sitting_out"]) == (
        1,
        1,
    )
    assert devices["d1"]["sitting_out"] == MISFIT and devices["d1"]["failing"] is None
    assert devices["d3"]["failing"] == 2 and devices["d3"]["sitting_out"] is None
    assert devices["d2"]["failing"] is None and devices["d2"]["sitting_out"] is None
