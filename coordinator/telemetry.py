"""What the coordinator did, for operators: counts, stages, rounds, recent errors.

The service tells a `Telemetry` about the events it already logs (a message
in, a message out, a refusal, a stage change, a round complete) and the
training plugin hands it each round's `TrainingRoundReport`; nothing else in the
coordinator knows it exists. It keeps counters and a bounded history in
memory, thread-safe, with no I/O and no third-party import, so the
coordinator runs (and logs its per-round line, `round_completed`) without the
``ops`` extra. `ursa.coordinator.live_status` joins it with the store's and the
transport's state into the snapshot behind ``/api/status`` and ``/metrics``.

Durations come from ``time.monotonic`` (a fake service clock in tests must
not make durations negative). Nothing here holds device data: labels and
distributions stay on the devices; a harness that knows them (the demo) may
add per-round figures with `annotate_round`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ursa.protocol.untrusted_text import escape

if TYPE_CHECKING:
    from ursa.coordinator.training import TrainingRoundReport

__all__ = [
    "ROUND_DURATION_BUCKETS_S",
    "DeviceRounds",
    "ErrorEvent",
    "RoundSummary",
    "Telemetry",
    "TelemetrySnapshot",
]

logger = logging.getLogger("ursa.coordinator")

ROUND_DURATION_BUCKETS_S = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Upper bounds of the round-duration histogram (seconds; +Inf is implied)."""
MAX_ROUNDS_KEPT = 1000
"""Round summaries kept for the dashboard (the oldest go first)."""
MAX_ERRORS_KEPT = 50
"""Recent warnings and errors kept."""
MAX_ERRORS_PER_DEVICE_KEPT = 5
"""Of those, at most this many about one device (a log record's ``device``):
a device's flood replaces its own lines on the dashboard, never others'."""

Clock = Callable[[], float]


@dataclass(frozen=True)
class RoundSummary:
    """One finished round as an operator sees it (no device data).

    ``accuracy`` and ``per_class_accuracy`` are the coordinator's evaluation
    of the new global model when it has one (the ``evaluate`` hook);
    ``federated_accuracy`` and ``federated_per_class`` the fleet's own
    (federated evaluation, of the model the round started from).
    """

    round: int
    selected: tuple[str, ...] = ()
    contributed: int | None = None
    version: int | None = None
    elapsed_s: float | None = None
    bytes_sent: int | None = None
    bytes_received: int | None = None
    accuracy: float | None = None
    per_class_accuracy: tuple[float | None, ...] = ()
    federated_accuracy: float | None = None
    federated_per_class: tuple[float | None, ...] = ()
    federated_version: int | None = None
    completed_at: float | None = None
    """Wall-clock time (``time.time``) the coordinator completed the round."""
    epsilon: float | None = None
    """Distributed DP: the privacy spent in total after this round (epsilon at
    the configured delta); None without DP."""
    extra: Mapping[str, float | None] = field(default_factory=dict)
    """Figures a harness added (`Telemetry.annotate_round`), e.g. the demo's
    ``l1_to_uniform``."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (non-finite numbers become None)."""
        return {
            "round": self.round,
            "selected": list(self.selected),
            "contributed": self.contributed,
            "version": self.version,
            "elapsed_s": _finite(self.elapsed_s),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "accuracy": _finite(self.accuracy),
            "per_class_accuracy": [_finite(a) for a in self.per_class_accuracy],
            "federated_accuracy": _finite(self.federated_accuracy),
            "federated_per_class": [_finite(a) for a in self.federated_per_class],
            "federated_version": self.federated_version,
            "completed_at": self.completed_at,
            "epsilon": _finite(self.epsilon),
            **{name: _finite(value) for name, value in self.extra.items()},
        }


@dataclass(frozen=True)
class DeviceRounds:
    """How often one device was selected, and how its training rounds ended.

    ``trained``: its update went into the round's aggregate; ``failed``: it
    was selected for a training round and its update did not (its training
    failed, its update was refused, or it came too late).
    """

    selected: int = 0
    trained: int = 0
    failed: int = 0


@dataclass(frozen=True)
class ErrorEvent:
    """A recent warning or error, as logged."""

    at: float
    level: str
    message: str
    device: str | None = None
    """The device the line is about, when the logger said (`RefusalLog`)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {
            "at": self.at,
            "level": self.level,
            "message": self.message,
            "device": self.device,
        }


@dataclass(frozen=True)
class TelemetrySnapshot:
    """A consistent copy of the counters and history (see `Telemetry.snapshot`)."""

    messages: Mapping[tuple[str, str], int]
    """(kind, direction) -> count; direction ``in`` or ``out``."""
    rejected: Mapping[str, int]
    """Reason (an `ErrorCode` value, or an admission drop) -> count."""
    updates: int
    rounds: tuple[RoundSummary, ...]
    round_buckets: tuple[int, ...]
    """Cumulative counts per `ROUND_DURATION_BUCKETS_S` bound, then +Inf."""
    round_duration_sum_s: float
    last_seen: Mapping[str, float]
    """Device -> wall-clock time of its last admitted message."""
    stage: str | None
    stage_since: float | None
    """Wall-clock time the current stage began (as this process saw it)."""
    errors: tuple[ErrorEvent, ...]
    accuracy: Mapping[str, float]
    """The latest accuracy by source: ``server``, ``federated``."""
    epsilon: float | None
    """Distributed DP: the privacy spent so far (None without DP)."""
    methods: tuple[str, ...]
    device_rounds: Mapping[str, DeviceRounds] = field(default_factory=dict)
    """Device -> its selections and training outcomes so far."""
    round_figures: tuple[str, ...] = ()
    """Per-round figures a harness said it adds (`Telemetry.add_round_figures`)."""


class Telemetry:
    """Thread-safe counters and history of one coordinator (see the module doc).

    Args:
        wall: Wall-clock seconds for "last seen" and event times.
        monotonic: Seconds for durations.
    """

    def __init__(
        self, *, wall: Clock = time.time, monotonic: Clock = time.monotonic
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._messages: dict[tuple[str, str], int] = {}
        self._rejected: dict[str, int] = {}
        self._updates = 0
        self._rounds: deque[RoundSummary] = deque(maxlen=MAX_ROUNDS_KEPT)
        self._records: dict[int, RoundSummary] = {}
        """Training records that came before their round completed."""
        self._annotations: dict[int, dict[str, float | None]] = {}
        self._buckets = [0] * (len(ROUND_DURATION_BUCKETS_S) + 1)
        self._duration_sum = 0.0
        self._last_seen: dict[str, float] = {}
        self._stage: str | None = None
        self._stage_since: float | None = None
        self._round_opened: dict[int, float] = {}
        self._errors: deque[ErrorEvent] = deque(maxlen=MAX_ERRORS_KEPT)
        self._accuracy: dict[str, float] = {}
        self._epsilon: float | None = None
        self._methods: tuple[str, ...] = ()
        self._traffic: Callable[[], tuple[int, int]] | None = None
        self._traffic_at_open: dict[int, tuple[int, int]] = {}
        self._device_rounds: dict[str, DeviceRounds] = {}
        self._round_figures: tuple[str, ...] = ()

    # --- set-up -------------------------------------------------------------

    def set_methods(self, methods: Iterable[str]) -> None:
        """The methods the federation runs (for the dashboard)."""
        with self._lock:
            self._methods = tuple(methods)

    def add_round_figures(self, *names: str) -> None:
        """A harness will annotate every round with these figures (`annotate_round`).

        The dashboard then says a figure comes with the first round instead of
        "not known here" while none has completed.
        """
        with self._lock:
            self._round_figures = tuple(dict.fromkeys((*self._round_figures, *names)))

    def set_traffic(self, traffic: Callable[[], tuple[int, int]]) -> None:
        """Where to read (bytes sent, bytes received) so far, for per-round bytes."""
        with self._lock:
            self._traffic = traffic

    # --- events from the service --------------------------------------------

    def received(self, device: str, kind: str) -> None:
        """A decoded message from ``device`` (before the stage handler judges it)."""
        now = self._wall()
        with self._lock:
            key = (kind, "in")
            self._messages[key] = self._messages.get(key, 0) + 1
            self._last_seen[device] = now

    def sent(self, kind: str) -> None:
        """A message queued for the broker."""
        with self._lock:
            key = (kind, "out")
            self._messages[key] = self._messages.get(key, 0) + 1

    def rejected(self, reason: str) -> None:
        """A message refused or dropped, by reason."""
        with self._lock:
            self._rejected[reason] = self._rejected.get(reason, 0) + 1

    def stage_changed(self, stage: str, round_index: int) -> None:
        """The service entered ``stage``; a SELECTING stage opens ``round_index``."""
        traffic = self._read_traffic()
        with self._lock:
            self._stage = stage
            self._stage_since = self._wall()
            if stage == "selecting" and round_index not in self._round_opened:
                self._round_opened[round_index] = self._monotonic()
                if traffic is not None:
                    self._traffic_at_open[round_index] = traffic

    def round_completed(self, round_index: int, selected: Iterable[str]) -> None:
        """The service completed ``round_index``: record it and log its line."""
        traffic = self._read_traffic()
        with self._lock:
            opened = self._round_opened.pop(round_index, None)
            elapsed = None if opened is None else self._monotonic() - opened
            at_open = self._traffic_at_open.pop(round_index, None)
            base = self._records.pop(round_index, None) or RoundSummary(round_index)
            summary = replace(
                base,
                selected=tuple(sorted(selected)) or base.selected,
                elapsed_s=elapsed if elapsed is not None else base.elapsed_s,
                completed_at=self._wall(),
                extra={**base.extra, **self._annotations.pop(round_index, {})},
            )
            if traffic is not None and at_open is not None:
                summary = replace(
                    summary,
                    bytes_sent=traffic[0] - at_open[0],
                    bytes_received=traffic[1] - at_open[1],
                )
            self._rounds.append(summary)
            for device in summary.selected:
                counts = self._device_rounds.get(device, DeviceRounds())
                self._device_rounds[device] = replace(
                    counts, selected=counts.selected + 1
                )
            if summary.elapsed_s is not None:
                self._observe_duration(summary.elapsed_s)
            for old in [r for r in self._round_opened if r < round_index]:
                self._round_opened.pop(old)  # rounds that never completed
                self._traffic_at_open.pop(old, None)
        logger.info("%s", _round_line(summary))

    def training_round(self, record: TrainingRoundReport) -> None:
        """The training plugin's record of a round (metrics, updates, version)."""
        summary = _from_record(record)
        contributed = set(record.contributed)
        with self._lock:
            self._updates += len(record.contributed)
            for device in record.selected:
                counts = self._device_rounds.get(device, DeviceRounds())
                trained = device in contributed
                self._device_rounds[device] = replace(
                    counts,
                    trained=counts.trained + trained,
                    failed=counts.failed + (not trained),
                )
            if summary.accuracy is not None:
                self._accuracy["server"] = summary.accuracy
            if summary.federated_accuracy is not None:
                self._accuracy["federated"] = summary.federated_accuracy
            if summary.epsilon is not None:
                self._epsilon = summary.epsilon
            done = next((r for r in self._rounds if r.round == record.round), None)
            if done is None:  # the usual order: the record, then the completion
                self._records[record.round] = summary
                return
            merged = replace(
                summary,
                selected=done.selected,
                elapsed_s=done.elapsed_s,
                bytes_sent=done.bytes_sent,
                bytes_received=done.bytes_received,
                completed_at=done.completed_at,
                extra=done.extra,
            )
            self._rounds = deque(
                (merged if r.round == record.round else r for r in self._rounds),
                maxlen=MAX_ROUNDS_KEPT,
            )

    def annotate_round(self, round_index: int, **figures: float | None) -> None:
        """Add a harness's figures to a round (before or after it completes)."""
        with self._lock:
            for i, summary in enumerate(self._rounds):
                if summary.round == round_index:
                    extra = {**summary.extra, **figures}
                    self._rounds[i] = replace(summary, extra=extra)
                    return
            self._annotations.setdefault(round_index, {}).update(figures)

    def error(self, level: str, message: str, device: str | None = None) -> None:
        """A warning or error to show as recent (see `RecentErrors`), escaped.

        A line about ``device`` replaces that device's oldest once it has
        `MAX_ERRORS_PER_DEVICE_KEPT` of them.
        """
        event = ErrorEvent(self._wall(), level, escape(message, 500), device)
        with self._lock:
            if device is not None:
                own = [e for e in self._errors if e.device == device]
                if len(own) >= MAX_ERRORS_PER_DEVICE_KEPT:
                    self._errors.remove(own[0])
            self._errors.append(event)

    # --- reading --------------------------------------------------------------

    def snapshot(self) -> TelemetrySnapshot:
        """A consistent copy of everything recorded so far."""
        with self._lock:
            return TelemetrySnapshot(
                messages=dict(self._messages),
                rejected=dict(self._rejected),
                updates=self._updates,
                rounds=tuple(self._rounds),
                round_buckets=tuple(self._buckets),
                round_duration_sum_s=self._duration_sum,
                last_seen=dict(self._last_seen),
                stage=self._stage,
                stage_since=self._stage_since,
                errors=tuple(self._errors),
                accuracy=dict(self._accuracy),
                epsilon=self._epsilon,
                methods=self._methods,
                device_rounds=dict(self._device_rounds),
                round_figures=self._round_figures,
            )

    # --- internals --------------------------------------------------------------

    def _read_traffic(self) -> tuple[int, int] | None:
        traffic = self._traffic
        if traffic is None:
            return None
        try:
            return traffic()
        except Exception:  # a closed transport: no per-round bytes, no crash
            return None

    def _observe_duration(self, seconds: float) -> None:
        self._duration_sum += seconds
        for i, bound in enumerate(ROUND_DURATION_BUCKETS_S):
            if seconds <= bound:
                self._buckets[i] += 1
        self._buckets[-1] += 1


class RecentErrors(logging.Handler):
    """A logging handler that copies warnings and errors into a `Telemetry`.

    Attach it to the ``ursa.coordinator`` logger while an HTTP view is up
    (`ursa.tools.observe`), so the dashboard shows what the log says.
    """

    def __init__(self, telemetry: Telemetry) -> None:
        super().__init__(level=logging.WARNING)
        self._telemetry = telemetry

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's level, message (no traceback) and ``device``, if any."""
        device = getattr(record, "device", None)
        try:
            self._telemetry.error(
                record.levelname,
                record.getMessage(),
                device if isinstance(device, str) else None,
            )
        except Exception:
            self.handleError(record)


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return _finite(float(value))


def _numbers(values: Any) -> tuple[float | None, ...]:
    if not isinstance(values, list | tuple):
        return ()
    return tuple(_number(v) for v in values)


def _from_record(record: TrainingRoundReport) -> RoundSummary:
    metrics = record.metrics
    fed = metrics.get("federated_eval")
    fed = fed if isinstance(fed, Mapping) else {}
    version = fed.get("version")
    privacy = metrics.get("privacy")
    privacy = privacy if isinstance(privacy, Mapping) else {}
    return RoundSummary(
        round=record.round,
        selected=tuple(record.selected),
        contributed=len(record.contributed),
        version=record.version,
        elapsed_s=record.elapsed_s,
        accuracy=_number(metrics.get("accuracy")),
        per_class_accuracy=_numbers(metrics.get("per_class_accuracy")),
        federated_accuracy=_number(fed.get("accuracy")),
        federated_per_class=_numbers(fed.get("per_class")),
        federated_version=version if isinstance(version, int) else None,
        epsilon=_number(privacy.get("epsilon_total")),
    )


def _round_line(summary: RoundSummary) -> str:
    """The one INFO line per round: who, how many updates, accuracy, bytes, time."""
    parts = [f"round {summary.round} complete: {len(summary.selected)} selected"]
    if summary.contributed is not None:
        parts.append(f"{summary.contributed} updates")
    if summary.accuracy is not None:
        parts.append(f"accuracy {summary.accuracy:.4f}")
    if summary.federated_accuracy is not None:
        parts.append(f"federated accuracy {summary.federated_accuracy:.4f}")
    if summary.bytes_sent is not None and summary.bytes_received is not None:
        parts.append(
            f"{_size(summary.bytes_received)} in, {_size(summary.bytes_sent)} out"
        )
    if summary.elapsed_s is not None:
        parts.append(f"{summary.elapsed_s:.1f} s")
    return ", ".join(parts)


def _size(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
