"""Per-sender token buckets and size caps (`ursa.protocol.admission_limits`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ursa.protocol.admission_limits import (
    DEFAULT_BURST,
    LOG_INTERVAL_S,
    AdmissionLimiter,
    AdmissionLimits,
    DropReason,
)
from ursa.protocol.chunking import DEFAULT_MAX_TRANSFER_BYTES
from ursa.protocol.messages import DEFAULT_CHUNK_SIZE, MAX_DEVICES


def _limiter(rate: float = 10.0, burst: int = 5, size: int = 1000) -> AdmissionLimiter:
    return AdmissionLimiter(
        AdmissionLimits(messages_per_s=rate, burst=burst), max_message_bytes=size
    )


def test_a_burst_passes_then_the_sender_is_dropped_until_tokens_refill() -> None:
    limiter = _limiter(rate=10.0, burst=5)

    first = [limiter.admit("d1", 10, 0.0).is_admitted for _ in range(7)]
    after_a_tenth = limiter.admit("d1", 10, 0.1)
    right_after = limiter.admit("d1", 10, 0.1)

    assert first == [True] * 5 + [False] * 2
    assert after_a_tenth.is_admitted
    assert right_after.reason is DropReason.RATE


def test_buckets_are_per_sender() -> None:
    limiter = _limiter(burst=2)
    for _ in range(10):
        limiter.admit("flooder", 10, 0.0)

    assert limiter.admit("quiet", 10, 0.0).is_admitted
    assert limiter.stats().dropped_by_sender == {"flooder": {DropReason.RATE: 8}}


def test_a_long_quiet_spell_refills_only_up_to_the_burst() -> None:
    limiter = _limiter(rate=10.0, burst=3)
    for _ in range(3):
        limiter.admit("d1", 10, 0.0)

    verdicts = [limiter.admit("d1", 10, 1000.0).is_admitted for _ in range(4)]

    assert verdicts == [True, True, True, False]


def test_a_clock_stepping_back_adds_no_tokens() -> None:
    limiter = _limiter(rate=10.0, burst=1)
    assert limiter.admit("d1", 10, 100.0).is_admitted

    assert not limiter.admit("d1", 10, 50.0).is_admitted
    assert not limiter.admit("d1", 10, 100.05).is_admitted
    assert limiter.admit("d1", 10, 100.2).is_admitted


def test_oversize_messages_are_dropped_and_counted_apart() -> None:
    limiter = _limiter(size=100)

    at_cap = limiter.admit("d1", 100, 0.0)
    over = limiter.admit("d1", 101, 0.0)

    assert at_cap.is_admitted
    assert over.reason is DropReason.OVERSIZE
    stats = limiter.stats()
    assert stats.admitted == 1
    assert stats.dropped == {DropReason.RATE: 0, DropReason.OVERSIZE: 1}
    assert stats.total_dropped() == 1


def test_drops_ask_for_one_log_line_per_sender_per_window_with_a_count() -> None:
    limiter = _limiter(rate=1.0, burst=1)
    limiter.admit("d1", 10, 0.0)

    verdicts = [limiter.admit("d1", 10, 0.0) for _ in range(100)]
    later = limiter.admit("d1", 10, LOG_INTERVAL_S + 0.5)  # takes the refill
    again = limiter.admit("d1", 10, LOG_INTERVAL_S + 0.5)
    other = limiter.admit("d2", 2000, 0.0)

    assert [v.should_log for v in verdicts] == [True] + [False] * 99
    assert verdicts[0].dropped_since_log == 1
    assert later.is_admitted and not later.should_log
    assert again.should_log and again.dropped_since_log == 100
    assert other.should_log and other.reason is DropReason.OVERSIZE


def test_defaults_admit_a_key_epoch_agent_sealing_for_the_largest_fleet() -> None:
    limiter = AdmissionLimiter(AdmissionLimits(), max_message_bytes=2 << 20)

    verdicts = [limiter.admit("agent", 600, 0.0) for _ in range(MAX_DEVICES)]

    assert DEFAULT_BURST >= MAX_DEVICES
    assert all(v.is_admitted for v in verdicts)
    assert limiter.stats().total_dropped() == 0


def test_defaults_admit_a_largest_transfer_sent_as_fast_as_it_is_split() -> None:
    limiter = AdmissionLimiter(AdmissionLimits(), max_message_bytes=2 << 20)
    chunks = DEFAULT_MAX_TRANSFER_BYTES // DEFAULT_CHUNK_SIZE  # 64 MiB in 256 KiB

    verdicts = [
        limiter.admit("d1", DEFAULT_CHUNK_SIZE + 200, 0.0) for _ in range(chunks)
    ]

    assert all(v.is_admitted for v in verdicts)


def test_the_config_is_frozen_typed_and_refuses_unknown_keys() -> None:
    limits = AdmissionLimits.model_validate({"messages_per_s": 5, "burst": 10})

    assert limits.messages_per_s == 5.0
    with pytest.raises(ValidationError):
        AdmissionLimits.model_validate({"burst": 0})
    with pytest.raises(ValidationError):
        AdmissionLimits.model_validate({"messages_per_s": 0})
    with pytest.raises(ValidationError):
        AdmissionLimits.model_validate({"rate": 5})
