"""Unacked: publishes awaiting acknowledgement, and `flush`'s wait for them."""

from __future__ import annotations

import threading

import pytest

from ursa.protocol.transport import NotConnectedError, TransportTimeoutError
from ursa.protocol.unacked import Unacked


def test_a_qos1_publish_is_unacked_until_its_puback() -> None:
    unacked = Unacked()
    unacked.published(1, qos=1)
    assert len(unacked) == 1
    unacked.acked(1)
    assert len(unacked) == 0
    unacked.wait(timeout_s=0, client_id="d1")


def test_a_qos0_publish_is_never_waited_for() -> None:
    unacked = Unacked()
    unacked.published(1, qos=0)
    assert len(unacked) == 0
    unacked.acked(1)  # written: nothing left behind to cancel a later mid 1
    unacked.published(1, qos=1)
    assert len(unacked) == 1


def test_an_ack_before_its_publish_is_recorded_cancels_it() -> None:
    unacked = Unacked()
    unacked.acked(3)  # paho's thread saw the PUBACK before publish() returned
    unacked.published(3, qos=1)
    assert len(unacked) == 0
    unacked.published(3, qos=1)  # the id again, later: a new publish
    assert len(unacked) == 1


def test_a_hand_off_counts_until_it_is_handed() -> None:
    unacked = Unacked()
    unacked.hand_off()
    assert len(unacked) == 1
    with pytest.raises(TransportTimeoutError, match="1 publishes"):
        unacked.wait(timeout_s=0, client_id="d1")
    unacked.published(4, qos=1)
    unacked.handed()
    assert len(unacked) == 1  # now waiting for the PUBACK of mid 4


def test_wait_returns_when_the_last_ack_comes_from_another_thread() -> None:
    unacked = Unacked()
    unacked.published(1, qos=1)
    unacked.published(2, qos=1)
    unacked.acked(1)
    acker = threading.Thread(target=unacked.acked, args=(2,))
    acker.start()

    unacked.wait(timeout_s=30, client_id="d1")
    acker.join()

    assert len(unacked) == 0


def test_wait_times_out_while_a_puback_is_missing() -> None:
    unacked = Unacked()
    unacked.published(1, qos=1)
    with pytest.raises(TransportTimeoutError, match="1 publishes unacknowledged"):
        unacked.wait(timeout_s=0, client_id="d1")


def test_close_ends_a_wait_with_not_connected() -> None:
    unacked = Unacked()
    unacked.published(1, qos=1)
    closer = threading.Thread(target=unacked.close)
    closer.start()

    with pytest.raises(NotConnectedError, match="d1 closed before PUBACKs"):
        unacked.wait(timeout_s=30, client_id="d1")
    closer.join()


def test_wait_after_close_with_nothing_pending_returns() -> None:
    unacked = Unacked()
    unacked.close()
    unacked.wait(timeout_s=0, client_id="d1")
