"""`FlickerMethod` (its `FlickerSession`) over the in-memory bus, real devices, CKKS.

The lab's `FlickerHost` lends the production method the runtime's parts
(store, signing point, router, refusals) and no admission: what reaches the
run here has passed `CoordinatorService`'s admission in a federation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ursa.coordinator.methods.flicker.outcome import FlickerPhase, FlickerServiceConfig
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.lab.simulate.flicker_fleet import FEDERATION, Fleet
from ursa.lab.simulate.flicker_run import run_flicker
from ursa.lab.simulate.flicker_tables import get_table
from ursa.protocol.envelope import decode, encode
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import (
    CosineReply,
    CosineRequest,
    CountUpdate,
    ErrorReply,
    ResampleRequest,
    RingHop,
    RingResult,
    RingStart,
)
from ursa.protocol.topics import CONTROL, up_topic

pytest.importorskip("tenseal")

D1 = {f"dev-{i + 1}": row for i, row in enumerate(get_table("D1"))}
SIX = {
    **D1,
    "dev-5": (40, 80, 900, 2000),
    "dev-6": (300, 20, 100, 900),
}


def _kind_filter(kind: str, sender: str) -> Callable[[str, str, str, bytes], bool]:
    """A bus drop filter losing every `kind` message that `sender` publishes."""

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        return s == sender and decode(payload).kind == kind and r == "coordinator"

    return drop


def _spy(fleet: Fleet) -> list[tuple[str, bytes]]:
    seen: list[tuple[str, bytes]] = []
    spy = InMemoryTransport(fleet.bus, "spy")
    spy.set_handler(lambda t, p: seen.append((t, p)))
    spy.subscribe("#")
    spy.connect()
    return seen


def _inject(fleet: Fleet, device: str, message: object, payload: bytes | None = None):
    """Publish on `device`'s up topic as if the device had sent it."""
    raw = InMemoryTransport(fleet.bus, f"inject-{device}")
    raw.connect()
    data = payload if payload is not None else encode(message)  # type: ignore[arg-type]
    raw.publish(up_topic(FEDERATION, device, CONTROL), data)
    raw.close()


@pytest.mark.parametrize("name", ["D1", "D3"])
def test_full_run_gives_the_same_result_as_run_flicker(
    name: str, fleets: Callable[..., Fleet]
) -> None:
    counts = {f"dev-{i + 1}": row for i, row in enumerate(get_table(name))}
    fleet = fleets(counts, seed=3)
    outcome = fleet.run()
    reference = run_flicker(counts, {d: dev.CountResampler() for d in counts})

    assert outcome.phase is FlickerPhase.DONE and outcome.state is not None
    assert outcome.gd_before == reference.gd_before
    assert outcome.state.global_counts == reference.state.global_counts
    assert outcome.state.stop_reason == reference.state.stop_reason
    assert outcome.state.updates == reference.state.updates
    assert outcome.state.localisations == reference.state.localisations
    finals = {d: p.counts for d, p in fleet.participants.items()}
    assert finals == {d: s.counts for d, s in reference.final.items()}
    dominants = [e["dominant"] for e in outcome.log if "localise" in e]
    assert dominants == [e["dominant"] for e in reference.log if "localise" in e]
    total = np.sum(list(finals.values()), axis=0)
    assert outcome.state.global_counts == tuple(int(c) for c in total)
    assert fleet.coordinator.rejections == []
    assert all(not p.rejections for p in fleet.participants.values())
    assert fleet.bus.handler_errors == 0


@pytest.mark.parametrize("position", [0, 2, 4])
def test_a_silent_ring_member_is_skipped(
    position: int, fleets: Callable[..., Fleet]
) -> None:
    order = list(D1)
    order.insert(position, "dev-9")
    fleet = fleets(D1, silent=["dev-9"])
    outcome = fleet.run(order)

    assert outcome.phase is FlickerPhase.DONE
    assert outcome.skipped == ("dev-9",)
    assert outcome.contributors == tuple(d for d in order if d != "dev-9")
    assert outcome.gd_before == tuple(int(c) for c in np.sum(list(D1.values()), 0))
    assert fleet.coordinator.rejections == []


def test_a_predecessor_silent_when_asked_to_reseal_is_skipped_too(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(SIX, silent=["dev-9"])
    order = ["dev-1", "dev-2", "dev-3", "dev-9", "dev-4", "dev-5", "dev-6"]
    hops: list[str] = []

    def drop(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        if sender == "dev-3" and receiver == "coordinator":
            hops.append(decode(payload).kind)
            return len(hops) > 1  # the first hop goes through, the re-seal not
        return False

    fleet.bus.drop_filter = drop
    outcome = fleet.run(order)

    assert outcome.phase is FlickerPhase.DONE
    assert outcome.skipped == ("dev-9", "dev-3")
    assert outcome.contributors == ("dev-1", "dev-2", "dev-4", "dev-5", "dev-6")
    rows = [SIX[d] for d in outcome.contributors]
    assert outcome.gd_before == tuple(int(c) for c in np.sum(rows, axis=0))


def test_the_ring_fails_rather_than_sum_fewer_than_three_devices(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1, silent=["dev-8", "dev-9"])
    outcome = fleet.run(["dev-1", "dev-8", "dev-2", "dev-9"])
    assert outcome.phase is FlickerPhase.FAILED
    assert outcome.gd_before is None
    assert "live devices" in (outcome.failure or "")


def test_a_candidate_silent_in_localisation_is_not_chosen(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1)
    fleet.bus.drop_filter = _kind_filter("cosine_reply", "dev-3")
    outcome = fleet.run()
    assert outcome.phase is FlickerPhase.DONE
    first = next(e for e in outcome.log if "localise" in e)
    assert "dev-3" not in first["localise"] and first["dominant"] != "dev-3"


def test_a_silent_dominant_device_is_treated_as_saturated(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1)
    fleet.bus.drop_filter = _kind_filter("count_update", "dev-3")  # first dominant
    outcome = fleet.run()
    assert outcome.state is not None and "dev-3" in outcome.state.saturated
    assert {"device": "dev-3", "silent": True}.items() <= outcome.log[1].items()
    assert outcome.phase is FlickerPhase.DONE


def test_a_reply_after_the_run_is_refused_with_a_signed_error_reply(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1)
    seen = _spy(fleet)
    fleet.run()
    before = len(fleet.coordinator.rejections)
    _inject(fleet, "dev-1", _late_cosine("dev-1"))

    (refusal,) = fleet.coordinator.rejections[before:]
    assert (refusal.device, refusal.kind, refusal.code) == (
        "dev-1",
        "cosine_reply",
        "late",
    )
    replies = [decode(p) for t, p in seen if "/dev/dev-1/down/" in t]
    errors = [m for m in replies if isinstance(m, ErrorReply)]
    assert [e.code for e in errors] == ["late"]
    assert errors[0].signature  # the runtime's refusal path signs it
    assert fleet.bus.handler_errors == 0


def _late_cosine(sender: str) -> CosineReply:
    return CosineReply(
        federation=FEDERATION,
        round=0,
        sender=sender,
        run_id="r1",
        step=1,
        masked_product=b"x" * 8,
    )


def test_second_forged_and_stale_replies_in_an_open_step_are_rejected(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1)
    seen = _spy(fleet)
    fleet.bus.drop_filter = _kind_filter("cosine_reply", "dev-4")  # keeps step open
    fleet.coordinator.start()
    assert fleet.coordinator.phase is FlickerPhase.LOCALISE
    reply = next(
        m
        for m in (decode(p) for _, p in seen)
        if isinstance(m, CosineReply) and m.sender == "dev-1"
    )
    again = reply.model_copy(update={"message_id": "again"})
    stale = reply.model_copy(update={"message_id": "stale", "step": 2})
    other_run = reply.model_copy(
        update={"message_id": "o", "run_id": "other", "sender": "dev-2"}
    )
    run = {"run_id": reply.run_id, "step": 1}
    forged = CosineReply(
        federation=FEDERATION,
        round=0,
        sender="dev-4",
        masked_product=b"UCK\x01" * 9,
        **run,
    )
    update = CountUpdate(
        federation=FEDERATION,
        round=0,
        sender="dev-2",
        delta=b"x",
        saturated=True,
        **run,
    )
    before = len(fleet.coordinator.rejections)
    for device, message in (
        ("dev-1", again),
        ("dev-1", stale),
        ("dev-2", other_run),
        ("dev-4", forged),
        ("dev-2", update),
    ):
        _inject(fleet, device, message)

    rejected = fleet.coordinator.rejections[before:]
    codes = [r.code for r in rejected]
    assert codes == ["malformed", "late", "late", "bad_ciphertext", "late"]
    assert "reply of run other" in rejected[2].reason
    assert fleet.coordinator.phase is FlickerPhase.LOCALISE
    fleet.clock.advance(1e6)
    fleet.coordinator.tick()  # closes the step with dev-1..3 and goes on
    first = fleet.coordinator.outcome().log[0]
    assert sorted(first["localise"]) == ["dev-1", "dev-2", "dev-3"]
    assert first["silent"] == ["dev-4"]


def test_hops_from_a_device_that_does_not_hold_the_sum_are_rejected(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1, silent=["dev-9"])
    seen = _spy(fleet)
    fleet.coordinator.start(["dev-1", "dev-2", "dev-9", "dev-3", "dev-4"])
    hop = next(
        m for m in (decode(p) for _, p in seen) if isinstance(m, RingHop)
    )  # dev-1 -> dev-2
    _inject(fleet, "dev-1", hop.model_copy(update={"message_id": "replayed"}))
    _inject(
        fleet, "dev-3", hop.model_copy(update={"sender": "dev-3", "message_id": "x"})
    )
    assert [r.code for r in fleet.coordinator.rejections] == ["late", "late"]
    assert fleet.coordinator.phase is FlickerPhase.RING


def test_a_device_missing_context_chunks_asks_for_them(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1)
    requests: list[str] = []

    def drop(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        kind = decode(payload).kind
        if sender == "dev-2" and kind == "chunk_request":
            requests.append(kind)
        return receiver == "dev-2" and kind == "chunk" and "/global/" in topic

    fleet.bus.drop_filter = drop
    outcome = fleet.run()
    assert requests == ["chunk_request"]
    assert outcome.phase is FlickerPhase.DONE
    assert fleet.participants["dev-2"].context_bytes == (
        fleet.coordinator.public_context_bytes
    )


def test_start_refuses_a_run_in_progress_and_bad_orders(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1, silent=["dev-9"])
    with pytest.raises(ValueError, match="not enrolled"):
        fleet.coordinator.start(["dev-1", "dev-2", "nobody"])
    with pytest.raises(ValueError, match=">= 3"):
        fleet.coordinator.start(["dev-1", "dev-2"])
    fleet.coordinator.start(["dev-1", "dev-9", "dev-2", "dev-3"])
    with pytest.raises(ValueError, match="in phase ring"):
        fleet.coordinator.start()


def test_config_defaults_are_the_papers() -> None:
    config = FlickerServiceConfig(federation="f", num_classes=4)
    assert (config.nabla, config.nabla_client) == (0.1, 0.05)


def test_requests_name_the_run_and_count_steps_replies_echo_them(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1)
    seen = _spy(fleet)
    run_id = fleet.coordinator.start()
    while fleet.coordinator.phase not in (FlickerPhase.DONE, FlickerPhase.FAILED):
        fleet.clock.advance(1e3)
        fleet.coordinator.tick()
    outcome = fleet.coordinator.outcome()
    messages = [decode(p) for _, p in seen]

    def steps(kind: type) -> set[int]:
        return {m.step for m in messages if isinstance(m, kind)}

    assert outcome.phase is FlickerPhase.DONE and outcome.run_id == run_id
    assert outcome.to_dict()["run_id"] == run_id
    stepped = [m for m in messages if hasattr(m, "step")]
    assert {m.run_id for m in stepped} == {run_id}
    asked = steps(CosineRequest) | steps(ResampleRequest)
    assert sorted(asked) == list(range(1, len(outcome.log) + 1))
    assert steps(CosineReply) == steps(CosineRequest)
    assert steps(CountUpdate) == steps(ResampleRequest) != set()
    ring = [m for m in messages if isinstance(m, RingStart | RingHop | RingResult)]
    assert {m.round for m in (*ring, *stepped)} == {0}  # before the first round


def test_context_re_requests_are_answered_a_few_times_per_device(
    fleets: Callable[..., Fleet],
) -> None:
    from ursa.protocol.chunking import DEFAULT_MAX_REQUESTS
    from ursa.protocol.messages import ChunkRequest

    fleet = fleets(D1)
    seen = _spy(fleet)
    fleet.coordinator.start(["dev-1", "dev-2", "dev-3", "dev-4"])
    announce = next(
        m for m in (decode(p) for _, p in seen if p) if m.kind == "ckks_context"
    )
    seen.clear()
    request = ChunkRequest(
        federation=FEDERATION,
        round=0,
        sender="dev-2",
        transfer_id=announce.transfer_id,  # type: ignore[attr-defined]
        indices=(0,),
    )
    for index in range(2 * DEFAULT_MAX_REQUESTS):
        _inject(fleet, "dev-2", request.model_copy(update={"message_id": f"r{index}"}))

    answered = [
        t for t, p in seen if "/dev/dev-2/down/" in t and decode(p).kind == "chunk"
    ]
    assert len(answered) == DEFAULT_MAX_REQUESTS
    refused = [r.code for r in fleet.coordinator.rejections]
    assert refused == ["transfer_failed"] * DEFAULT_MAX_REQUESTS


def test_an_outage_gives_the_ring_and_the_open_step_their_time_back(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(D1, silent=["dev-9"])
    config = fleet.coordinator.config
    fleet.bus.drop_filter = _kind_filter("cosine_reply", "dev-4")  # step stays open
    fleet.coordinator.start(["dev-1", "dev-9", "dev-2", "dev-3", "dev-4"])
    fleet.coordinator.method.extend_deadlines(1000.0)  # the broker was away

    fleet.clock.advance(config.hop_deadline_s + 1)
    fleet.coordinator.tick()
    assert fleet.coordinator.outcome().skipped == ()  # dev-9 still has its turn
    fleet.clock.advance(1000.0)
    fleet.coordinator.tick()
    assert fleet.coordinator.outcome().skipped == ("dev-9",)
    assert fleet.coordinator.phase is FlickerPhase.LOCALISE  # dev-1 re-sealed to dev-2
    fleet.coordinator.method.extend_deadlines(1000.0)
    fleet.clock.advance(config.reply_deadline_s + 1)
    fleet.coordinator.tick()
    assert fleet.coordinator.outcome().log == ()  # still waiting for dev-4
    fleet.clock.advance(1000.0)
    fleet.coordinator.tick()
    assert fleet.coordinator.outcome().log[0]["silent"] == ["dev-4"]
