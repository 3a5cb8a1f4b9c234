"""SubscriptionBook: wanted filters, SUBACKs due, and waits for their results."""

from __future__ import annotations

import threading

import pytest

from ursa.protocol.subscriptions import SUBACK_MEMORY, SubscriptionBook
from ursa.protocol.transport import (
    InvalidTopicError,
    SubscriptionRefusedError,
    TransportTimeoutError,
)


def test_filters_keep_the_latest_qos_in_first_added_order() -> None:
    book = SubscriptionBook()
    book.add("a/#", 1)
    book.add("b/+", 0)
    book.add("a/#", 2)
    book.remove("c")  # never wanted: no error

    assert book.filters() == [("a/#", 2), ("b/+", 0)]
    book.remove("a/#")
    assert book.filters() == [("b/+", 0)]


@pytest.mark.parametrize(("pattern", "qos"), [("a/b#", 1), ("", 1), ("a", 3)])
def test_a_bad_filter_or_qos_is_refused_and_not_kept(pattern: str, qos: int) -> None:
    book = SubscriptionBook()

    with pytest.raises(ValueError):  # InvalidTopicError is a ValueError too
        book.add(pattern, qos)
    assert book.filters() == []


def test_invalid_filter_raises_the_transport_error() -> None:
    with pytest.raises(InvalidTopicError):
        SubscriptionBook().add("a/+b", 1)


def test_a_sent_subscribe_is_due_until_its_suback() -> None:
    book = SubscriptionBook()
    book.sent(7)
    assert book.is_due
    book.acked(7, [False])
    assert not book.is_due


def test_a_suback_before_its_send_is_recorded_leaves_nothing_due() -> None:
    book = SubscriptionBook()
    book.acked(7, [False])  # paho's thread was quicker than the caller
    book.sent(7)
    assert not book.is_due


def test_a_new_connection_forgets_subacks_due_on_the_old_one() -> None:
    book = SubscriptionBook()
    book.sent(1)
    book.new_connection()
    assert not book.is_due


def test_wait_returns_once_the_suback_accepts_every_filter() -> None:
    book = SubscriptionBook()
    book.add("a", 1)
    book.add("b", 1)
    acker = threading.Thread(target=book.acked, args=(5, [False, False]))
    acker.start()

    book.wait(5, ["a", "b"], timeout_s=30)
    acker.join()

    assert book.filters() == [("a", 1), ("b", 1)]


def test_wait_forgets_refused_filters_and_names_them() -> None:
    book = SubscriptionBook()
    book.add("a", 1)
    book.add("secret/#", 1)
    book.acked(5, [False, True])

    with pytest.raises(SubscriptionRefusedError, match="secret/#"):
        book.wait(5, ["a", "secret/#"], timeout_s=30)
    assert book.filters() == [("a", 1)]


def test_wait_without_a_suback_times_out_and_keeps_the_filter() -> None:
    book = SubscriptionBook()
    book.add("a", 1)

    with pytest.raises(TransportTimeoutError):
        book.wait(5, ["a"], timeout_s=0)
    assert book.filters() == [("a", 1)]


def test_only_the_latest_subacks_are_remembered() -> None:
    book = SubscriptionBook()
    for mid in range(SUBACK_MEMORY + 1):
        book.acked(mid, [False])

    book.wait(SUBACK_MEMORY, ["a"], timeout_s=0)  # the newest is there
    with pytest.raises(TransportTimeoutError):
        book.wait(0, ["a"], timeout_s=0)  # the oldest aged out
