"""The agent's one-hot check of the registrations: pages, verdicts, exclusions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ursa.coordinator.registry_check import RegistryCheckError, RegistryChecking
from ursa.coordinator.round_state import Stage
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import RANK_PAGE_BUDGET, BaseMessage, RegistryVerdict

FED = "fed"


def _check(devices: int, blob_bytes: int = 8) -> RegistryChecking:
    blobs = {f"d{i:03d}": bytes([i % 256]) * blob_bytes for i in range(devices)}
    return RegistryChecking.start(3, blobs, np.random.default_rng(0))


def test_the_pages_carry_every_registration_once_shuffled_without_ids() -> None:
    check = _check(600)
    first = check.requests(FED, 0, again=False)
    assert [r.page for r in first] == [0, 1]  # two pages open at a time
    assert all(r.pages == 3 and r.epoch == 3 for r in first)
    order = [d for page in check.paging.pages for d in page]
    assert sorted(order) == sorted(check.blobs) and order != sorted(order)
    assert first[0].registries == tuple(check.blobs[d] for d in order[:256])
    assert check.requests(FED, 0, again=False) == []  # the window is full


def test_verdicts_exclude_their_bad_entries_once_and_open_the_next_page() -> None:
    check = _check(600)
    check.requests(FED, 0, again=False)
    page0 = check.paging.pages[0]
    assert check.record(0, len(page0), (3, 7))
    assert not check.record(0, len(page0), (5,))  # a copy: nothing more
    assert check.excluded == {page0[3], page0[7]}
    assert [r.page for r in check.requests(FED, 0, again=False)] == [2]
    for page in (1, 2):
        check.record(page, len(check.paging.pages[page]), ())
    assert check.is_complete
    assert check.good() == sorted(set(check.blobs) - {page0[3], page0[7]})


def test_a_verdict_of_another_cut_or_page_is_refused() -> None:
    check = _check(10)
    with pytest.raises(RegistryCheckError):
        check.record(0, 9, ())
    with pytest.raises(RegistryCheckError):
        check.record(1, 10, ())
    with pytest.raises(ValueError):  # a position past the page
        RegistryVerdict(federation=FED, round=0, sender="d0", epoch=3, page=0,
                        entries=2, bad=(2,))  # fmt: skip


def test_long_registrations_make_smaller_pages() -> None:
    check = _check(300, blob_bytes=RANK_PAGE_BUDGET // 100)
    assert max(len(p) for p in check.paging.pages) == 100


def _kind(payload: bytes) -> str:
    try:
        return str(decode(payload).kind)
    except ProtocolError:
        return "?"


def _hold_verdicts(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
    return receiver == "coordinator" and _kind(payload) == "registry_verdict"


def test_the_sum_waits_for_a_signed_verdict_and_a_restart_checks_again(
    federation: Any,
) -> None:
    fed = federation(num_devices=4, k=2, tries=1, rounds=1)
    fed.bus.drop_filter = _hold_verdicts
    fed.start()
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    assert fed.messages("registry_sum") == []
    ((_, verdict),) = fed.messages("registry_verdict")
    assert verdict.entries == 4 and verdict.bad == ()
    ((_, check),) = fed.messages("registry_check")
    own = set(type(check).model_fields) - set(BaseMessage.model_fields)
    assert own == {"kind", "epoch", "page", "pages", "registries"}  # no device id

    fed.bus.drop_filter = None
    forged = verdict.model_copy(update={"signature": b"\0" * 64, "message_id": "f1"})
    fed.send_as(verdict.sender, forged)
    assert [e.code for e in fed.errors_to(verdict.sender)] == ["bad_signature"]
    assert fed.messages("registry_sum") == []

    fed.coordinator_transport.kill()  # a restart mid-check: the pages go again
    fed.coordinator.store.close()
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    fed.settle()

    assert len(fed.messages("registry_check")) == 2
    ((_, registry_sum),) = fed.messages("registry_sum")
    assert registry_sum.num_parties == 4 and fed.coordinator.is_done
