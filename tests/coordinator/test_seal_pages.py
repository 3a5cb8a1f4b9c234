"""The key epoch's sealing pages: bounded pages, one box per recipient, restarts."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from ursa.coordinator.seal_pages import BoxVerdict, SealPaging
from ursa.crypto.sealing import SEAL_OVERHEAD_BYTES
from ursa.protocol.envelope import encode
from ursa.protocol.messages import (
    COORDINATOR,
    MAX_BOX_BYTES,
    SEAL_PAGE_SIZE,
    SEALED_KEYS_BUDGET,
    DeviceKeys,
    KeyEpochStart,
    RegistrySum,
    SealedBox,
    SealedKeys,
    SealRequest,
)
from ursa.protocol.transport import DEFAULT_MAX_PAYLOAD_BYTES

FLEET = 100_000
COORD = {"federation": "fed", "round": 0, "sender": COORDINATOR}


def _ids(n: int) -> list[str]:
    return [f"device-{i:06d}" for i in range(n)]


def test_a_fleet_of_100000_is_cut_into_bounded_pages_each_recipient_once() -> None:
    ids = _ids(FLEET)
    paging = SealPaging.plan(ids, ids[5])

    assert paging.num_pages == -(-(FLEET - 1) // SEAL_PAGE_SIZE)
    assert max(len(page) for page in paging.pages) == SEAL_PAGE_SIZE
    counts = Counter(d for page in paging.pages for d in page)
    assert set(counts) == set(ids) - {ids[5]}
    assert set(counts.values()) == {1}


def test_every_message_of_a_100000_device_key_epoch_fits_the_payload_cap() -> None:
    ids = _ids(FLEET)
    paging = SealPaging.plan(ids, ids[0])
    key = os.urandom(32)
    largest = 0
    for index, page in enumerate(paging.pages):
        request = SealRequest(
            **COORD,
            epoch=1,
            page=index,
            pages=paging.num_pages,
            recipients=tuple(
                DeviceKeys(device_id=d, x25519_public=key, ed25519_public=key)
                for d in page
            ),
        )
        largest = max(largest, len(encode(request)))
    notice = KeyEpochStart(
        **COORD,
        epoch=1,
        agent=ids[0],
        agent_keys=DeviceKeys(device_id=ids[0], x25519_public=key, ed25519_public=key),
        num_classes=10,
        groups=(1, 2, 10),
        sigma=(0.7, 0.1, 0.0),
        max_parties=FLEET,
        key_bits=4096,
        methods=("dubhe",),
        signature=bytes(64),
    )
    # the agent's reply: a full page of the largest boxes, split by its budget
    box = SealedBox(recipient=ids[1], box=bytes(MAX_BOX_BYTES))
    per_message = SEALED_KEYS_BUDGET // MAX_BOX_BYTES
    sealed = SealedKeys(
        federation="fed",
        round=0,
        sender=ids[0],
        epoch=1,
        page=0,
        boxes=tuple(
            box.model_copy(update={"recipient": d}) for d in ids[1 : 1 + per_message]
        ),
    )
    # the default registry at max_parties 100,000 and 4096-bit keys: 1 ciphertext
    registry_sum = RegistrySum(
        **COORD, epoch=1, registry_sum=bytes(23 + 1024), num_parties=FLEET
    )

    sizes = [largest, *(len(encode(m)) for m in (notice, sealed, registry_sum))]
    assert max(sizes) < DEFAULT_MAX_PAYLOAD_BYTES // 3
    assert SEAL_OVERHEAD_BYTES < MAX_BOX_BYTES


def test_pages_open_two_at_a_time_and_the_next_when_one_completes() -> None:
    paging = SealPaging.plan(_ids(7), "device-000000", page_size=2)

    assert paging.pages[0] == ("device-000001", "device-000002")
    assert paging.open_next() == [0, 1]
    assert paging.open_next() == []
    assert paging.record("device-000001") == (BoxVerdict.NEW, None)
    assert paging.record("device-000002") == (BoxVerdict.NEW, 0)
    assert paging.open_next() == [2]
    assert paging.open_pages == (1, 2)


def test_a_second_box_is_a_duplicate_and_strangers_are_unknown() -> None:
    paging = SealPaging.plan(_ids(5), "device-000000", page_size=2)
    paging.open_next()

    assert paging.record("device-000001")[0] is BoxVerdict.NEW
    assert paging.record("device-000001")[0] is BoxVerdict.DUPLICATE
    assert paging.record("device-000002") == (BoxVerdict.NEW, 0)
    assert paging.record("device-000002")[0] is BoxVerdict.DUPLICATE  # page done
    assert paging.record("device-000000")[0] is BoxVerdict.UNKNOWN  # the agent
    assert paging.record("intruder")[0] is BoxVerdict.UNKNOWN
    assert paging.is_recipient("device-000004")
    assert not paging.is_recipient("device-000000")


def test_done_through_counts_the_completed_prefix_only() -> None:
    paging = SealPaging.plan(_ids(7), "device-000000", page_size=2)
    paging.open_next()
    for device in paging.pages[1]:
        paging.record(device)

    assert paging.pages_done == 1 and paging.done_through == 0
    for device in paging.pages[0]:
        paging.record(device)
    assert paging.done_through == 2


def test_a_restart_skips_the_completed_pages_and_loses_none_of_the_rest() -> None:
    ids = _ids(9)
    paging = SealPaging.plan(ids, ids[0], page_size=2, done_through=2)

    assert paging.open_next() == [2, 3]
    assert paging.record(ids[1])[0] is BoxVerdict.DUPLICATE  # page 0: done before
    # a box of page 3 sealed before the restart, then one of page 2
    assert paging.record(ids[7]) == (BoxVerdict.NEW, None)
    for device in paging.pages[2]:
        paging.record(device)
    paging.record(ids[8])
    assert paging.open_next() == []
    assert paging.is_complete


def test_a_box_of_a_page_not_yet_open_counts_without_skipping_pages() -> None:
    ids = _ids(11)
    paging = SealPaging.plan(ids, ids[0], page_size=2)
    paging.open_next()

    assert paging.record(ids[9]) == (BoxVerdict.NEW, None)  # page 4, never sent
    for device in (*paging.pages[0], *paging.pages[1]):
        paging.record(device)
    assert paging.open_next() == [2]  # page 4 holds a place in the window
    for device in paging.pages[2]:
        paging.record(device)
    assert paging.open_next() == [3]  # and page 3 is not skipped
    for device in (*paging.pages[3], ids[10]):
        paging.record(device)
    assert paging.open_next() == []
    assert paging.is_complete


def test_only_the_agent_needs_no_page_and_bad_sizes_are_refused() -> None:
    assert SealPaging.plan(["a"], "a").num_pages == 0
    assert SealPaging.plan(["a"], "a").is_complete
    with pytest.raises(ValueError):
        SealPaging.plan(["a", "b"], "a", page_size=0)


def test_reopen_sends_a_completed_page_again_before_the_unsent_ones() -> None:
    ids = _ids(9)  # the agent and 8 others: 4 pages of 2
    paging = SealPaging.plan(ids, ids[0], page_size=2, done_through=3)

    assert paging.reopen([ids[3], ids[4], ids[7], "stranger"]) == [1]
    assert paging.done_through == 1 and not paging.is_complete
    assert paging.open_next() == [1, 3]
    assert paging.record(ids[3]) == (BoxVerdict.NEW, None)
    assert paging.record(ids[4]) == (BoxVerdict.NEW, 1)
    assert paging.record(ids[1])[0] is BoxVerdict.DUPLICATE  # page 0 stayed done
    assert paging.reopen([]) == []
