"""The rank hand-out's pages: shuffled, bounded, resumable at the completed prefix."""

from __future__ import annotations

import numpy as np

from ursa.coordinator.config import RegistryConfig
from ursa.coordinator.methods.dubhe.ranks import RankHandout, rank_page_size
from ursa.coordinator.seal_pages import BoxVerdict
from ursa.protocol.envelope import encode
from ursa.protocol.messages import RANK_PAGE_SIZE
from ursa.protocol.transport import DEFAULT_MAX_PAYLOAD_BYTES


def entries(n: int, blob_bytes: int) -> dict[str, tuple[bytes, bytes]]:
    return {
        f"d{i:06d}": (bytes([i % 251 + 1]) * blob_bytes, bytes(32)) for i in range(n)
    }


def test_pages_at_100000_devices_stay_far_below_the_payload_cap() -> None:
    blob = RegistryConfig().ciphertext_bytes(2048)  # the default registry
    fleet = entries(100_000, blob)
    handout = RankHandout.start(1, fleet, np.random.default_rng(0))
    assert handout.paging.num_pages == 391 and handout.page_size == RANK_PAGE_SIZE
    assert sorted(handout.order) == sorted(fleet)  # every registrant, once
    assert handout.order != tuple(sorted(fleet))  # in a shuffled order
    for page in (0, 390):
        message = handout.request(page, fleet, "fed", 1)
        assert len(message.entries) <= RANK_PAGE_SIZE
        assert len(encode(message)) < DEFAULT_MAX_PAYLOAD_BYTES // 4


def test_long_registries_make_smaller_pages() -> None:
    assert rank_page_size(100) == RANK_PAGE_SIZE
    assert rank_page_size(64 * 1024) == 4
    assert rank_page_size(900 * 1024) == 1


def test_a_restored_hand_out_resumes_after_the_completed_prefix() -> None:
    fleet = entries(10, 100)
    handout = RankHandout.planned(1, tuple(sorted(fleet)), 3, 0)
    assert handout.pages_to_send(again=False) == [0, 1]
    for device in handout.paging.pages[0]:
        verdict, _ = handout.record(device)
        assert verdict is BoxVerdict.NEW
    assert handout.record(handout.paging.pages[0][0])[0] is BoxVerdict.DUPLICATE
    assert handout.device_at(0, 2) == handout.paging.pages[0][2]
    assert handout.device_at(0, 3) is None and handout.device_at(9, 0) is None

    again = RankHandout.restored(handout.plan_record(), handout.done_record())
    assert again is not None and again.order == handout.order
    assert again.pages_to_send(again=False) == [1, 2]  # page 0 was complete
    assert RankHandout.restored({"epoch": 1}, None) is None  # unreadable
    other = RankHandout.restored(handout.plan_record(), {"epoch": 2, "done_through": 1})
    assert other is not None and other.pages_to_send(again=False) == [0, 1]
