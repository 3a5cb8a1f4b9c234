"""``/metrics``: a coordinator's status in the Prometheus exposition format.

A custom collector reads one `ServiceStatus` per scrape (`ursa.coordinator.live_status`)
and turns it into metric families, so nothing in the coordinator holds a
prometheus_client object and the coordinator runs without the ``ops`` extra.
Each HTTP view registers its collector in its own `CollectorRegistry` (not the
process's global one), so two services in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from ursa.coordinator.live_status import ServiceStatus
from ursa.coordinator.telemetry import ROUND_DURATION_BUCKETS_S

__all__ = ["CONTENT_TYPE", "StatusCollector", "metrics_registry", "render"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The exposition format's content type."""


class StatusCollector(Collector):
    """Metric families of the status ``source`` returns at each scrape."""

    def __init__(self, source: Callable[[], ServiceStatus]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        """One snapshot, every ``ursa_*`` family."""
        s = self._source()
        t = s.telemetry
        yield _gauge("ursa_round", "The current (or last) round.", s.round)
        yield _gauge(
            "ursa_rounds_completed", "Rounds completed so far.", s.rounds_completed
        )
        yield _gauge("ursa_rounds_target", "Rounds configured.", s.rounds_total)
        yield _gauge("ursa_key_epoch", "The current key epoch.", s.epoch)
        stage = GaugeMetricFamily(
            "ursa_stage", "1 for the stage the coordinator is in.", labels=["stage"]
        )
        stage.add_metric([s.stage], 1.0)
        yield stage
        yield _gauge(
            "ursa_devices_enrolled", "Devices enrolled.", float(len(s.enrolled))
        )
        online = len(s.online & set(s.enrolled))
        yield _gauge("ursa_devices_online", "Enrolled devices online.", online)
        yield _gauge(
            "ursa_devices_failing",
            "Devices that failed two or more selected rounds in a row.",
            len(s.health.failing),
        )
        yield _gauge(
            "ursa_devices_sitting_out",
            "Devices sitting the current key epoch out (their model or data does "
            "not fit, or they failed too many rounds in a row).",
            len(s.health.sitting_out),
        )
        failing = GaugeMetricFamily(
            "ursa_device_failed_rounds_in_a_row",
            "Selected rounds a failing device failed in a row, by device.",
            labels=["device"],
        )
        for device, count in sorted(s.health.failing.items()):
            failing.add_metric([device], float(count))
        yield failing
        yield _gauge(
            "ursa_broker_connected", "1 while the broker link is up.", s.connected
        )
        links = GaugeMetricFamily(
            "ursa_site_link_up",
            "1 while a site broker's bridge to the core is up, 0 while down.",
            labels=["site"],
        )
        for site, link in sorted(s.site_links.items()):
            links.add_metric([site], float(link.up))
        yield links
        info = GaugeMetricFamily(
            "ursa_federation_info",
            "The federation and the methods it runs (value 1).",
            labels=["federation", "methods"],
        )
        info.add_metric([s.federation, ",".join(t.methods)], 1.0)
        yield info
        buckets = [
            (_bound(b), float(c))
            for b, c in zip(ROUND_DURATION_BUCKETS_S, t.round_buckets, strict=False)
        ]
        buckets.append(("+Inf", float(t.round_buckets[-1])))
        yield HistogramMetricFamily(
            "ursa_round_duration_seconds",
            "Wall time of completed rounds, from announce to completion.",
            buckets=buckets,
            sum_value=t.round_duration_sum_s,
        )
        yield CounterMetricFamily(
            "ursa_updates_total", "Model updates aggregated.", value=t.updates
        )
        messages = CounterMetricFamily(
            "ursa_messages_total",
            "Protocol messages by kind, in (admitted for decoding) and out.",
            labels=["kind", "direction"],
        )
        for (kind, direction), count in sorted(t.messages.items()):
            messages.add_metric([kind, direction], float(count))
        yield messages
        rejected = CounterMetricFamily(
            "ursa_rejected_messages_total",
            "Messages refused (error code) or dropped by the admission limits.",
            labels=["reason"],
        )
        for reason, count in sorted(t.rejected.items()):
            rejected.add_metric([reason], float(count))
        yield rejected
        traffic = CounterMetricFamily(
            "ursa_bytes_total", "MQTT payload bytes.", labels=["direction"]
        )
        traffic.add_metric(["in"], float(s.bytes_received))
        traffic.add_metric(["out"], float(s.bytes_sent))
        yield traffic
        accuracy = GaugeMetricFamily(
            "ursa_accuracy",
            "Latest global-model accuracy: server (held-out test data, when the "
            "coordinator evaluates) or federated (the devices' own data).",
            labels=["source"],
        )
        for source, value in sorted(t.accuracy.items()):
            accuracy.add_metric([source], value)
        yield accuracy
        if t.epsilon is not None:
            yield GaugeMetricFamily(
                "ursa_privacy_epsilon",
                "Distributed differential privacy spent so far by the secure sums "
                "(epsilon at the configured [aggregation] delta).",
                value=t.epsilon,
            )
        yield CounterMetricFamily(
            "ursa_crypto_seconds",
            "Seconds this process spent in Paillier arithmetic.",
            value=s.crypto_s,
        )


def metrics_registry(source: Callable[[], ServiceStatus]) -> CollectorRegistry:
    """A registry of its own holding one `StatusCollector` over ``source``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(source))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The exposition text of ``registry`` now."""
    return generate_latest(registry)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))


def _bound(seconds: float) -> str:
    return f"{seconds:g}"
