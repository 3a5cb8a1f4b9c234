"""Adaptive replies (issue 33): explicit answers under the threshold, silence above.

In memory, on the fake clock: a federation under ``[selection]
explicit_replies_below`` runs every round without the clock moving (each
window closes once every online device has answered); one above it runs
silence-means-no as before; replies the round's rule does not allow are
refused, typed, and count for nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.config import SelectionConfig
from ursa.coordinator.methods.dubhe import DubheSelection, DubheStep
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.selection_method import SelectionRequest
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import PaillierPublicKey
from ursa.crypto.paillier_keys import generate_keypair
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import BaseMessage, ErrorCode, Volunteer
from ursa.protocol.router import RejectedError, Router

from .test_selection import DEVICES, FED, FakeContext

ROUNDS = 3


def answers(fed: Any) -> list[Volunteer]:
    return [m for _, m in fed.messages("volunteer")]


def test_under_the_threshold_every_device_answers_and_no_window_is_waited_out(
    federation: Any,
) -> None:
    fed = federation(num_devices=8, rounds=ROUNDS)
    started = fed.clock.now

    fed.start(settle=False)  # the clock never moves: no window may run out

    assert fed.coordinator.is_done
    assert fed.clock.now == started
    announces = [m for _, m in fed.messages("round_announce")]
    assert [m.round for m in announces] == list(range(1, ROUNDS + 1))
    for announce in announces:  # the rule is signed into each announce
        assert announce.explicit_replies is True
        verify_signature(
            fed.coordinator.identity, signing_bytes(announce), announce.signature
        )
    per_round = Counter(m.round for m in answers(fed))
    assert per_round == {r: 8 for r in range(1, ROUNDS + 1)}
    assert any(not any(m.draws) for m in answers(fed))  # the explicit "no"s
    assert all(len(m.selected) == 3 for _, m in fed.messages("selection_result"))


def test_above_the_threshold_silence_means_no_as_before(federation: Any) -> None:
    fed = federation(
        num_devices=8,
        rounds=ROUNDS,
        selection=SelectionConfig(explicit_replies_below=8),  # 8 online: not under
    )

    fed.start(settle=False)

    assert not fed.coordinator.is_done  # round 1 waits its window out
    assert fed.volunteering()
    (announce,) = [m for _, m in fed.messages("round_announce")]
    assert announce.explicit_replies is False
    assert answers(fed) and all(any(m.draws) for m in answers(fed))
    fed.settle()
    assert fed.coordinator.is_done
    assert all(any(m.draws) for m in answers(fed))


def test_a_second_answer_after_the_window_changes_nothing(federation: Any) -> None:
    fed = federation(num_devices=8, rounds=1)
    fed.start(settle=False)
    assert fed.coordinator.is_done
    store = fed.coordinator.store
    record = DubheRecords(store).round(1)
    first = record.volunteers["d00"]
    again = Volunteer(federation=FED, round=1, sender="d00", draws=(True,) * 3)

    fed.send_as("d00", again.model_copy(update={"message_id": "another"}))

    record = DubheRecords(store).round(1)
    assert record.volunteers["d00"] == first
    assert len(record.volunteers) == 8


# --- the method alone, on a fake context -------------------------------------------


@pytest.fixture(scope="module")
def public_key() -> PaillierPublicKey:
    return generate_keypair(512)[0]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    store.add_round(1, 1, b"announce")
    yield store
    store.close()


def explicit(ctx: FakeContext, now: float) -> SelectionRequest:
    return SelectionRequest(
        round=1,
        epoch=1,
        k=2,
        eligible=frozenset(ctx.online),
        rng=np.random.default_rng(0),
        now=now,
        explicit_replies=True,
    )


def open_method(ctx: FakeContext, tries: int = 1) -> tuple[DubheSelection, Router]:
    dubhe = DubheSelection(
        ctx, tries=tries, num_classes=4, volunteer_s=10, distributions_s=10, agent_s=10
    )
    router = Router("coordinator")
    dubhe.register(router)
    dubhe.open_round(explicit(ctx, 0.0))
    return dubhe, router


def say(router: Router, device: str, draws: tuple[bool, ...]) -> None:
    router.dispatch(Volunteer(federation=FED, round=1, sender=device, draws=draws))


def refused(router: Router, message: BaseMessage) -> str:
    with pytest.raises(RejectedError) as caught:
        router.dispatch(message)
    return caught.value.code


def test_the_window_closes_once_every_eligible_device_answered(
    store: CoordinatorStore, public_key: PaillierPublicKey
) -> None:
    ctx = FakeContext(store, public_key)
    dubhe, router = open_method(ctx)
    for device in DEVICES[:-1]:
        say(router, device, (device in ("d0", "d1", "d2"),))
        # three yes already (K = 2): explicit replies still wait for the rest
        assert dubhe.select(explicit(ctx, 1.0)) is None
    say(router, DEVICES[-1], (False,))

    selection = dubhe.select(explicit(ctx, 1.0))

    assert selection is not None and set(selection.selected) <= {"d0", "d1", "d2"}
    stored = DubheRecords(store).round(1)
    assert set(stored.volunteers) == set(DEVICES)


def test_a_device_gone_offline_is_not_waited_for(
    store: CoordinatorStore, public_key: PaillierPublicKey
) -> None:
    ctx = FakeContext(store, public_key)
    dubhe, router = open_method(ctx)
    for device in ("d0", "d1", "d2"):
        say(router, device, (device != "d2",))
    assert dubhe.select(explicit(ctx, 1.0)) is None
    ctx.online -= {"d3", "d4"}

    selection = dubhe.select(explicit(ctx, 1.0))

    assert selection is not None and set(selection.selected) == {"d0", "d1"}


def test_fewer_than_k_devices_all_answered_wait_the_backoff_not_every_tick(
    store: CoordinatorStore, public_key: PaillierPublicKey, caplog: Any
) -> None:
    ctx = FakeContext(store, public_key)
    ctx.online = {"d0"}  # K = 2: one device online, and it answered
    dubhe, router = open_method(ctx)
    say(router, "d0", (True,))
    with caplog.at_level(logging.WARNING):
        for tick in range(5):
            assert dubhe.select(explicit(ctx, 1.0 + tick / 10)) is None
    shorts = [r for r in caplog.records if "re-announcing" in r.getMessage()]
    assert len(shorts) == 1 and ctx.announces == 1  # not one per tick
    ctx.online.add("d1")
    say(router, "d1", (True,))  # a new answer: the window may close at once

    selection = dubhe.select(explicit(ctx, 2.0))

    assert selection is not None and set(selection.selected) == {"d0", "d1"}


def test_hostile_answers_are_refused_typed_and_count_for_nothing(
    store: CoordinatorStore, public_key: PaillierPublicKey, caplog: Any
) -> None:
    ctx = FakeContext(store, public_key)
    dubhe, router = open_method(ctx, tries=2)
    say(router, "d0", (False, True))
    say(router, "d0", (False, True))  # the same answer again (a restart): once
    other = Volunteer(federation=FED, round=1, sender="d0", draws=(True, True))
    assert refused(router, other) == ErrorCode.MALFORMED  # a second, other answer
    extra = Volunteer(federation=FED, round=1, sender="d1", draws=(True,) * 3)
    assert refused(router, extra) == ErrorCode.MALFORMED  # a try that is not
    stranger = Volunteer(federation=FED, round=1, sender="x9", draws=(True, True))
    assert refused(router, stranger) == ErrorCode.UNAUTHORISED
    ahead = Volunteer(federation=FED, round=2, sender="d1", draws=(True, True))
    assert refused(router, ahead) == ErrorCode.WRONG_ROUND

    stored = DubheRecords(store).round(1)
    assert stored.volunteers == {"d0": (False, True)}
    for device in DEVICES[1:]:
        say(router, device, (True, True))
    assert dubhe.select(explicit(ctx, 1.0)) is None  # closed: distributions
    assert dubhe.step is DubheStep.DISTRIBUTIONS
    after = Volunteer(federation=FED, round=1, sender="d0", draws=(True, True))
    assert refused(router, after.model_copy(update={"message_id": "x"})) == "late"
    stored = DubheRecords(store).round(1)
    assert stored.volunteers["d0"] == (False, True)


def test_under_silence_an_all_no_answer_is_refused(
    store: CoordinatorStore, public_key: PaillierPublicKey
) -> None:
    ctx = FakeContext(store, public_key)
    dubhe = DubheSelection(
        ctx, tries=1, num_classes=4, volunteer_s=10, distributions_s=10, agent_s=10
    )
    router = Router("coordinator")
    dubhe.register(router)
    silent = explicit(ctx, 0.0)
    dubhe.open_round(SelectionRequest(1, 1, 2, silent.eligible, silent.rng, 0.0, False))

    no = Volunteer(federation=FED, round=1, sender="d0", draws=(False,))

    assert refused(router, no) == ErrorCode.MALFORMED
    stored = DubheRecords(store).round(1)
    assert stored.volunteers == {}


def test_the_threshold_counts_online_devices() -> None:
    rule = SelectionConfig()
    assert rule.explicit_replies(1999) and not rule.explicit_replies(2000)
    assert not SelectionConfig(explicit_replies_below=0).explicit_replies(1)
