"""Gather: replies folded once, completion by answers, last wills or deadline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.device_sets import OnlineDevices
from ursa.coordinator.gather import Fold, Gather, save_gather
from ursa.coordinator.phase import PhaseRecordError, PhaseStatus
from ursa.coordinator.store import CoordinatorStore
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    ErrorCode,
    MeanReport,
    MeanRequest,
    MeanSum,
)
from ursa.protocol.router import RejectedError

FED = "fed"
DEVICES = ("d0", "d1", "d2")


class SumFold(Fold[MeanReport, int]):
    """A toy fold: the sum of the reports' first bytes (epoch 1 only)."""

    def request(self) -> BaseMessage:
        return MeanRequest(
            federation=FED, round=4, sender=COORDINATOR, purpose="toy", epoch=1,
            model="m", model_version=0,
        )  # fmt: skip

    def initial(self) -> int:
        return 0

    def check(self, reply: MeanReport) -> None:
        if reply.epoch != 1:
            raise RejectedError(ErrorCode.WRONG_EPOCH, "epoch 1 only")

    def apply(self, state: int, device: str, reply: MeanReport) -> int:
        if reply.ciphertext == b"bad":
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, "bad")
        return state + reply.ciphertext[0]

    def result(self, state: int) -> BaseMessage | None:
        return MeanSum(
            federation=FED,
            round=4,
            sender=COORDINATOR,
            purpose="toy",
            epoch=1,
            model="m",
            model_version=0,
            ciphertext=bytes([state]),
            num_parties=1,
        )

    def dump(self, state: int) -> Any:
        return {"sum": state}

    def load(self, data: Any, answered: frozenset[str]) -> int:
        return int(data["sum"])


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[BaseMessage, str | None]] = []

    def __call__(self, message: BaseMessage, device: str | None) -> None:
        self.sent.append((message, device))

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m, _ in self.sent]

    def sums(self) -> list[int]:
        return [m.ciphertext[0] for m, _ in self.sent if isinstance(m, MeanSum)]


def report(device: str, value: int, epoch: int = 1) -> MeanReport:
    return MeanReport(
        federation=FED, round=4, sender=device, purpose="toy", epoch=epoch,
        model="m", model_version=0, ciphertext=bytes([value]),
    )  # fmt: skip


def open_gather(
    out: Outbox, online: frozenset[str] = frozenset(DEVICES), **kw: Any
) -> Gather[MeanReport, int]:
    return Gather.open(
        "toy/4",
        SumFold(),
        expected=DEVICES,
        online=online,
        now=100.0,
        timeout_s=10.0,
        send=out,
        **kw,
    )


def reloaded(gather: Gather[MeanReport, int]) -> Gather[MeanReport, int]:
    return Gather.from_record(json.loads(json.dumps(gather.to_record())), SumFold())


def test_every_expected_reply_closes_it_and_sends_the_result() -> None:
    out = Outbox()
    gather = open_gather(out)
    assert out.kinds() == ["MeanRequest"]

    for value, device in enumerate(DEVICES, start=1):
        assert gather.is_open
        outcome = gather.offer(device, report(device, value), out)
        assert outcome is UpdateOutcome.ACCEPTED

    assert gather.status is PhaseStatus.DONE and gather.state == 6
    assert out.sums() == [6]


def test_a_duplicate_is_ignored_and_refusals_are_typed() -> None:
    out = Outbox()
    gather = open_gather(out)
    gather.offer("d0", report("d0", 5), out)

    assert gather.offer("d0", report("d0", 7), out) is UpdateOutcome.DUPLICATE
    assert gather.state == 5
    with pytest.raises(RejectedError) as info:
        gather.offer("d1", report("d1", 1, epoch=2), out)
    assert info.value.code == ErrorCode.WRONG_EPOCH
    with pytest.raises(RejectedError) as info:
        gather.offer("outsider", report("outsider", 1), out)
    assert info.value.code == ErrorCode.UNAUTHORISED
    with pytest.raises(RejectedError) as info:
        bad = report("d1", 1).model_copy(update={"ciphertext": b"bad"})
        gather.offer("d1", bad, out)
    assert info.value.code == ErrorCode.BAD_CIPHERTEXT
    assert gather.pending == {"d1", "d2"}, "a refused reply is not an answer"


def test_last_wills_remove_the_rest_and_a_return_is_waited_for() -> None:
    out = Outbox()
    gather = open_gather(out)
    gather.offer("d0", report("d0", 2), out)
    gather.device_left("d1", out)
    gather.device_returned("d1")
    gather.track_online(frozenset({"d0", "d1"}), out)  # d2's last will

    assert gather.is_open and gather.pending == {"d1"}
    gather.device_left("d1", out)

    assert gather.status is PhaseStatus.DONE and out.sums() == [2]
    assert gather.absent == {"d1", "d2"}


def test_nobody_online_closes_at_once_without_a_result() -> None:
    out = Outbox()
    gather = open_gather(out, online=frozenset())

    assert gather.status is PhaseStatus.FALLBACK
    assert out.kinds() == ["MeanRequest"]
    with pytest.raises(RejectedError) as info:
        gather.offer("d0", report("d0", 1), out)
    assert info.value.code == ErrorCode.LATE


def test_the_deadline_closes_with_what_arrived() -> None:
    out = Outbox()
    gather = open_gather(out)
    gather.offer("d2", report("d2", 3), out)

    assert gather.poll(109.9, out) is PhaseStatus.OPEN
    assert gather.poll(110.0, out) is PhaseStatus.DONE
    assert out.sums() == [3]


def test_the_deadline_below_min_replies_falls_back() -> None:
    out = Outbox()
    gather = open_gather(out, min_replies=2)
    gather.offer("d2", report("d2", 3), out)

    assert gather.poll(110.0, out) is PhaseStatus.FALLBACK
    assert out.sums() == []


def test_min_replies_zero_answers_even_an_empty_gather() -> None:
    out = Outbox()
    gather = open_gather(out, online=frozenset(), min_replies=0)

    assert gather.status is PhaseStatus.DONE and out.sums() == [0]


def test_a_restored_gather_resumes_mid_phase_without_double_counting() -> None:
    out = Outbox()
    gather = open_gather(out)
    gather.offer("d0", report("d0", 4), out)
    gather.device_left("d2", out)

    restored = reloaded(gather)
    restored.restarted(200.0, out)

    assert restored.to_record() == {**gather.to_record(), "deadline_at": 210.0}
    assert out.kinds() == ["MeanRequest", "MeanRequest"]
    assert restored.offer("d0", report("d0", 9), out) is UpdateOutcome.DUPLICATE
    assert restored.poll(209.0, out) is PhaseStatus.OPEN
    restored.offer("d1", report("d1", 1), out)
    assert restored.status is PhaseStatus.DONE and out.sums() == [5]

    closed = reloaded(restored)
    closed.restarted(300.0, out)
    assert closed.status is PhaseStatus.DONE and out.sums() == [5, 5]


def test_a_record_of_another_kind_is_refused() -> None:
    with pytest.raises(PhaseRecordError):
        Gather.from_record({"kind": "wait"}, SumFold())


def test_tracking_the_services_view_follows_its_changes_not_the_fleet() -> None:
    out = Outbox()
    ready = set(DEVICES)
    online = OnlineDevices(ready, dict, lambda: 1)
    gather = open_gather(out, online=frozenset(DEVICES))
    gather.track_online(online, out)  # the first call scans once

    ready.discard("d1")  # gone, but the view was not told: not followed
    ready.discard("d2")
    online.touch("d2")
    gather.track_online(online, out)
    assert gather.pending == {"d0", "d1"} and gather.absent == {"d2"}

    online.forget()  # everything may have changed: one rescan
    gather.track_online(online, out)
    assert gather.pending == {"d0"}


class CountingStore:
    """A `GatherStore` that keeps what each save wrote (its JSON size)."""

    def __init__(self, store: CoordinatorStore) -> None:
        self.store = store
        self.writes: list[tuple[str, int]] = []

    def save_phase(self, key: str, round_index: int, record: dict[str, Any]) -> None:
        self.writes.append(("record", len(json.dumps(record))))
        self.store.save_phase(key, round_index, record)

    def save_phase_reply(self, key: str, device: str, fields: dict[str, Any]) -> None:
        self.writes.append(("reply", len(json.dumps(fields)) + len(device)))
        self.store.save_phase_reply(key, device, fields)


def test_a_reply_saves_one_row_and_a_restart_resumes_from_the_rows(
    tmp_path: Path,
) -> None:
    fleet = [f"d{i:05d}" for i in range(5000)]
    out, store = Outbox(), CoordinatorStore(tmp_path / "db.sqlite3")
    saves = CountingStore(store)
    gather = Gather.open(
        "toy/4", SumFold(), expected=fleet, online=frozenset(fleet), now=100.0,
        timeout_s=10.0, send=out,
    )  # fmt: skip
    save_gather(saves, gather, 4)  # opened: the whole record, once
    for i, device in enumerate(fleet[:3]):
        gather.offer(device, report(device, i + 1), out)
        save_gather(saves, gather, 4, device)
    kinds = [kind for kind, _ in saves.writes]
    assert kinds == ["record", "reply", "reply", "reply"]
    assert max(size for kind, size in saves.writes if kind == "reply") < 200
    assert saves.writes[0][1] > 5000 * 8  # every expected id, at open only
    store.close()

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    saved = store.phase("toy/4")
    assert saved is not None
    restored = Gather.from_record(saved, SumFold())
    restored.restarted(200.0, out)
    assert restored.answered == set(fleet[:3]) and restored.state == 6
    assert restored.offer(fleet[0], report(fleet[0], 9), out) is (
        UpdateOutcome.DUPLICATE
    )
    assert len(restored.pending) == len(fleet) - 3
    store.close()
