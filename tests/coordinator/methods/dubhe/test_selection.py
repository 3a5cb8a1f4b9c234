"""DubheSelection with a fake context: its steps, windows, answers and restarts."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from ursa.coordinator.methods.dubhe import DubheSelection, DubheStep
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.selection_method import Selection, SelectionRequest
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import (
    EncryptedVector,
    PaillierPublicKey,
    PaillierSecretKey,
    decrypt_real_sum,
    encrypt_reals,
    encrypted_vector_from,
)
from ursa.crypto.paillier_keys import generate_keypair
from ursa.edge_sdk.registration import DISTRIBUTION_CODEC
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import (
    AgentAnswer,
    BaseMessage,
    EncryptedDistribution,
    ErrorCode,
    TryAssignment,
    TrySums,
    Volunteer,
)
from ursa.protocol.router import RejectedError, Router

FED = "fed"
CLASSES = 4
DEVICES = ("d0", "d1", "d2", "d3", "d4")
AGENT = DeviceIdentity.generate("d4")


@pytest.fixture(scope="module")
def keys() -> tuple[PaillierPublicKey, PaillierSecretKey]:
    return generate_keypair(512)


@dataclass
class FakeContext:
    """The runtime's side of `SelectionContext`, recording what is sent."""

    store: CoordinatorStore
    public_key: PaillierPublicKey
    online: set[str] = field(default_factory=lambda: set(DEVICES))
    sent: list[tuple[BaseMessage, str | None]] = field(default_factory=list)
    announces: int = 0
    federation: str = FED

    def epoch_view(self) -> EpochView:
        return EpochView(1, self.public_key, frozenset(DEVICES), "d4", AGENT.public())

    def online_devices(self) -> frozenset[str]:
        return frozenset(self.online)

    def send(self, message: BaseMessage, device: str | None) -> None:
        self.sent.append((message, device))

    def reannounce(self) -> None:
        self.announces += 1

    def of(self, kind: type[BaseMessage]) -> list[tuple[BaseMessage, str | None]]:
        return [(m, d) for m, d in self.sent if isinstance(m, kind)]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CoordinatorStore]:
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    store.add_round(1, 1, b"announce")
    yield store
    store.close()


def method(ctx: FakeContext, tries: int) -> tuple[DubheSelection, Router]:
    dubhe = DubheSelection(
        ctx,
        tries=tries,
        num_classes=CLASSES,
        volunteer_s=10,
        distributions_s=10,
        agent_s=10,
    )
    router = Router("coordinator")
    dubhe.register(router)
    return dubhe, router


def request(ctx: FakeContext, now: float, seed: int = 0) -> SelectionRequest:
    return SelectionRequest(
        round=1,
        epoch=1,
        k=2,
        eligible=frozenset(ctx.online),
        rng=np.random.default_rng(seed),
        now=now,
    )


def volunteer(router: Router, device: str, draws: tuple[bool, ...]) -> None:
    router.dispatch(Volunteer(federation=FED, round=1, sender=device, draws=draws))


def distribution(key: PaillierPublicKey, device: str, values: list[float]) -> bytes:
    vector = encrypt_reals(key, DISTRIBUTION_CODEC, 2, values)
    return vector.to_bytes(key)


def test_one_try_selects_as_soon_as_it_has_k_volunteers(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0])
    dubhe, router = method(ctx, tries=1)
    dubhe.open_round(request(ctx, 0.0))
    volunteer(router, "d0", (True,))
    assert dubhe.select(request(ctx, 1.0)) is None
    with pytest.raises(RejectedError) as refused:  # silence means no: never sent
        volunteer(router, "d1", (False,))
    assert refused.value.code == ErrorCode.MALFORMED
    assert dubhe.select(request(ctx, 1.0)) is None
    volunteer(router, "d2", (True,))

    selection = dubhe.select(request(ctx, 1.0))  # K = 2 volunteers: no wait

    assert selection == Selection(("d0", "d2"), 0)
    assert dubhe.step is DubheStep.SELECTED and ctx.announces == 0
    stored = DubheRecords(store).round(1)
    assert stored.tries == (("d0", "d2"),)
    volunteer(router, "d3", (True,))  # after an early close: normal, not an error
    stored = DubheRecords(store).round(1)
    assert "d3" not in stored.volunteers


def test_at_the_deadline_a_short_try_is_topped_up_from_the_silent_devices(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0])
    dubhe, router = method(ctx, tries=1)
    dubhe.open_round(request(ctx, 0.0))
    volunteer(router, "d0", (True,))  # d1..d4 drew no: silent

    assert dubhe.select(request(ctx, 9.9)) is None
    selection = dubhe.select(request(ctx, 10.0))

    assert selection is not None and "d0" in selection.selected
    assert len(selection.selected) == 2 and set(selection.selected) <= set(DEVICES)
    assert ctx.announces == 0  # fewer than K volunteers is normal: no re-announce


def test_too_few_eligible_reannounce_with_growing_windows_never_in_a_loop(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0], online={"d0"})  # the rest are away
    dubhe, router = method(ctx, tries=1)
    dubhe.open_round(request(ctx, 0.0))
    volunteer(router, "d0", (True,))  # 1 < K devices to choose from

    for _ in range(100):  # a step per message and tick: no re-announce yet
        assert dubhe.select(request(ctx, 9.9)) is None
    assert ctx.announces == 0
    assert dubhe.select(request(ctx, 10.0)) is None and ctx.announces == 1
    assert dubhe.select(request(ctx, 29.9)) is None and ctx.announces == 1
    assert dubhe.select(request(ctx, 30.0)) is None and ctx.announces == 2
    assert dubhe.select(request(ctx, 69.9)) is None and ctx.announces == 2

    ctx.online.add("d1")  # back, silent: the top-up may draw it
    selection = dubhe.select(request(ctx, 70.0))
    assert selection is not None and set(selection.selected) == {"d0", "d1"}


def test_a_restart_mid_volunteering_keeps_the_counts(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0])
    dubhe, router = method(ctx, tries=2)
    dubhe.open_round(request(ctx, 0.0))
    volunteer(router, "d0", (True, True))
    volunteer(router, "d1", (True, False))

    again = FakeContext(store, keys[0])  # the coordinator restarts on the store
    restarted, router2 = method(again, tries=2)
    restarted.resume(request(again, 100.0))
    assert restarted.step is DubheStep.VOLUNTEERING
    volunteer(router2, "d1", (True, False))  # a re-sent answer: counted once
    assert restarted.select(request(again, 101.0)) is None  # try 1 has 1 < K
    volunteer(router2, "d2", (False, True))
    assert restarted.select(request(again, 101.0)) is None  # now distributions
    assert restarted.step is DubheStep.DISTRIBUTIONS
    stored = DubheRecords(store).round(1)
    assert stored.tries is not None
    assert set(stored.tries[0]) == {"d0", "d1"}
    assert set(stored.tries[1]) == {"d0", "d2"}


def test_refuses_unregistered_wrong_round_and_wrong_draw_counts(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0])
    dubhe, router = method(ctx, tries=2)
    dubhe.open_round(request(ctx, 0.0))
    cases = [
        (Volunteer(federation=FED, round=2, sender="d0", draws=(1, 1)), "wrong_round"),
        (Volunteer(federation=FED, round=1, sender="x9", draws=(1, 1)), "unauthorised"),
        (Volunteer(federation=FED, round=1, sender="d0", draws=(1,)), "malformed"),
    ]
    for message, code in cases:
        with pytest.raises(RejectedError) as refused:
            router.dispatch(message)
        assert refused.value.code == code


def run_to_agent(
    ctx: FakeContext, router: Router, dubhe: DubheSelection, key: PaillierPublicKey
) -> dict[str, list[float]]:
    """Everyone volunteers for both tries and delivers; the sums go to the agent."""
    dubhe.open_round(request(ctx, 0.0))
    for device in DEVICES:
        volunteer(router, device, (True, True))
    assert dubhe.select(request(ctx, 1.0)) is None
    assert dubhe.step is DubheStep.DISTRIBUTIONS
    members = {d for m, d in ctx.of(TryAssignment)}
    plain = {
        d: [0.25 * (i % 4 == c) for c in range(CLASSES)] for i, d in enumerate(members)
    }
    for device in sorted(members):
        router.dispatch(
            EncryptedDistribution(
                federation=FED,
                round=1,
                sender=device,
                distribution=distribution(key, device, plain[device]),
            )
        )
    assert dubhe.select(request(ctx, 2.0)) is None
    assert dubhe.step is DubheStep.AGENT
    return plain


def test_the_agents_signed_choice_selects_its_try_and_the_sums_match_plaintext(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    public, secret = keys
    ctx = FakeContext(store, public)
    dubhe, router = method(ctx, tries=2)
    plain = run_to_agent(ctx, router, dubhe, public)

    [(sums, to)] = ctx.of(TrySums)
    assert to == "d4" and isinstance(sums, TrySums)
    stored = DubheRecords(store).round(1)
    assert stored.tries is not None
    for h, blob in enumerate(sums.sums):
        vector = encrypted_vector_from(blob, public)
        total = decrypt_real_sum(secret, DISTRIBUTION_CODEC, 2, vector)
        expected = np.sum([plain[d] for d in stored.tries[h]], axis=0)
        np.testing.assert_allclose(total, expected, atol=1e-6)

    answer = AgentAnswer(federation=FED, round=1, sender="d4", best_try=1)
    forged = answer.model_copy(update={"signature": b"\0" * 64})
    with pytest.raises(RejectedError) as refused:
        router.dispatch(forged)
    assert refused.value.code == ErrorCode.BAD_SIGNATURE
    signed = answer.model_copy(update={"signature": AGENT.sign(signing_bytes(answer))})
    router.dispatch(signed)
    assert dubhe.select(request(ctx, 3.0)) == Selection(stored.tries[1], 1)


def test_a_silent_agent_falls_back_to_the_first_complete_try_and_asks_a_rekey(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0])
    dubhe, router = method(ctx, tries=2)
    run_to_agent(ctx, router, dubhe, keys[0])
    stored = DubheRecords(store).round(1)
    assert stored.tries is not None

    assert dubhe.select(request(ctx, 11.9)) is None
    assert dubhe.select(request(ctx, 12.0)) == Selection(stored.tries[0], 0, rekey=True)


def test_a_restart_mid_distributions_resends_to_the_silent_and_counts_once(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    public = keys[0]
    ctx = FakeContext(store, public)
    dubhe, router = method(ctx, tries=2)
    dubhe.open_round(request(ctx, 0.0))
    for device in DEVICES:
        volunteer(router, device, (True, True))
    dubhe.select(request(ctx, 1.0))
    members = sorted({d for _, d in ctx.of(TryAssignment) if d is not None})
    first = members[0]
    blob = distribution(public, first, [1.0, 0, 0, 0])
    sent = EncryptedDistribution(
        federation=FED, round=1, sender=first, distribution=blob
    )
    router.dispatch(sent)

    again = FakeContext(store, public)  # the coordinator restarts on the store
    restarted, router2 = method(again, tries=2)
    restarted.resume(request(again, 100.0))

    assert restarted.step is DubheStep.DISTRIBUTIONS
    assert sorted(d for _, d in again.of(TryAssignment)) == members[1:]
    router2.dispatch(sent)  # a re-sent answer: ignored, not summed twice
    stored = DubheRecords(store).round(1)
    assert list(stored.distributions) == [first]
    with pytest.raises(RejectedError) as refused:
        router2.dispatch(
            EncryptedDistribution(
                federation=FED, round=1, sender=members[1], distribution=b"junk"
            )
        )
    assert refused.value.code == ErrorCode.BAD_CIPHERTEXT


# --- bounded influence: malformed distributions, bad sums, the cap ---------------


def _raw_distribution(key: PaillierPublicKey, ciphertexts: int) -> bytes:
    """A one-party distribution of CLASSES values in `ciphertexts` ciphertexts."""
    cts = tuple(key.raw_encrypt(0) for _ in range(ciphertexts))
    return EncryptedVector(key.fingerprint(), CLASSES, 1, cts).to_bytes(key)


def _deliver(router: Router, key: PaillierPublicKey, devices: list[str]) -> None:
    for device in devices:
        router.dispatch(
            EncryptedDistribution(
                federation=FED,
                round=1,
                sender=device,
                distribution=distribution(key, device, [0.25] * CLASSES),
            )
        )


def _answer(**fields: object) -> AgentAnswer:
    answer = AgentAnswer(federation=FED, round=1, sender="d4", **fields)
    return answer.model_copy(update={"signature": AGENT.sign(signing_bytes(answer))})


def _assert_topped_up(selection: Selection | None, h: int, kept: str) -> None:
    """Try `h` without the dropped d0, topped up to K, and no new key epoch."""
    assert selection is not None and selection.try_index == h
    assert kept in selection.selected and "d0" not in selection.selected
    assert len(selection.selected) == 2 and not selection.rekey


def _two_tries(ctx: FakeContext, router: Router, dubhe: DubheSelection) -> None:
    """Tries {d0, d1} and {d0, d2}: d0 volunteered in both, d1 and d2 in one."""
    dubhe.open_round(request(ctx, 0.0))
    volunteer(router, "d0", (True, True))
    volunteer(router, "d1", (True, False))
    volunteer(router, "d2", (False, True))
    assert dubhe.select(request(ctx, 1.0)) is None
    assert dubhe.step is DubheStep.DISTRIBUTIONS


def test_a_distribution_of_the_wrong_ciphertext_count_drops_its_sender_only(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    public = keys[0]
    ctx = FakeContext(store, public)
    dubhe, router = method(ctx, tries=2)
    _two_tries(ctx, router, dubhe)
    bad = EncryptedDistribution(
        federation=FED, round=1, sender="d0", distribution=_raw_distribution(public, 2)
    )

    with pytest.raises(RejectedError) as refused:
        router.dispatch(bad)
    assert refused.value.code == ErrorCode.BAD_CIPHERTEXT
    assert "2 ciphertexts" in refused.value.reason
    with pytest.raises(RejectedError):  # a second try, well-formed: still out
        _deliver(router, public, ["d0"])
    _deliver(router, public, ["d1", "d2"])
    assert dubhe.select(request(ctx, 2.0)) is None  # nobody left to wait for

    [(sums, _)] = ctx.of(TrySums)
    assert isinstance(sums, TrySums) and sums.member_counts == (1, 1)
    router.dispatch(_answer(best_try=1))
    _assert_topped_up(dubhe.select(request(ctx, 3.0)), 1, "d2")


def test_bad_sums_beside_a_good_one_select_the_best_good_try_without_a_rekey(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0])
    dubhe, router = method(ctx, tries=2)
    _two_tries(ctx, router, dubhe)
    _deliver(router, keys[0], ["d0", "d1", "d2"])
    assert dubhe.select(request(ctx, 2.0)) is None

    with pytest.raises(ValueError, match="also a bad sum"):
        AgentAnswer(federation=FED, round=1, sender="d4", best_try=0, bad_tries=(0,))
    with pytest.raises(RejectedError):  # a position past the sums
        router.dispatch(_answer(best_try=0, bad_tries=(2,)))
    router.dispatch(_answer(best_try=1, bad_tries=(0,)))

    assert dubhe.select(request(ctx, 3.0)) == Selection(("d0", "d2"), 1)


def test_all_bad_sums_drop_the_member_they_share_and_sum_again(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    public, secret = keys
    ctx = FakeContext(store, public)
    dubhe, router = method(ctx, tries=2)
    _two_tries(ctx, router, dubhe)
    _deliver(router, public, ["d0", "d1", "d2"])
    assert dubhe.select(request(ctx, 2.0)) is None

    router.dispatch(_answer(best_try=None, bad_tries=(0, 1)))
    assert dubhe.select(request(ctx, 3.0)) is None  # d0, in both, is dropped
    first, again = (m for m, _ in ctx.of(TrySums))
    assert isinstance(again, TrySums) and again.member_counts == (1, 1)
    assert again.message_id != first.message_id  # the agent answers it anew
    for blob in again.sums:
        vector = encrypted_vector_from(blob, public)
        total = decrypt_real_sum(secret, DISTRIBUTION_CODEC, 2, vector)
        np.testing.assert_allclose(total, [0.25] * CLASSES, atol=1e-6)
    router.dispatch(_answer(best_try=0))

    _assert_topped_up(dubhe.select(request(ctx, 4.0)), 0, "d1")


def test_all_bad_sums_with_no_shared_member_select_uniformly_without_a_rekey(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    ctx = FakeContext(store, keys[0])
    dubhe, router = method(ctx, tries=2)
    dubhe.open_round(request(ctx, 0.0))
    for device, draws in (("d0", (True, False)), ("d1", (True, False))):
        volunteer(router, device, draws)
    for device in ("d2", "d3"):
        volunteer(router, device, (False, True))
    dubhe.select(request(ctx, 1.0))
    _deliver(router, keys[0], ["d0", "d1", "d2", "d3"])
    dubhe.select(request(ctx, 2.0))

    router.dispatch(_answer(best_try=None, bad_tries=(0, 1)))
    selection = dubhe.select(request(ctx, 3.0))

    assert selection is not None and not selection.rekey
    assert len(selection.selected) == 2 and len(ctx.of(TrySums)) == 1


def test_a_device_at_the_participation_cap_sits_the_round_out(
    store: CoordinatorStore, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    store.add_round(2, 1, b"announce")
    store.add_round(3, 1, b"announce")
    store.set_selection(1, ("d0", "d1"), 0, b"result")
    store.set_selection(2, ("d0", "d3"), 0, b"result")
    ctx = FakeContext(store, keys[0])
    dubhe = DubheSelection(
        ctx,
        tries=1,
        num_classes=CLASSES,
        volunteer_s=10,
        distributions_s=10,
        agent_s=10,
        cap=ParticipationCap(0.5, 4),  # 2 of any 4 rounds
    )
    router = Router("coordinator")
    dubhe.register(router)
    third = SelectionRequest(
        round=3, epoch=1, k=2, eligible=frozenset(DEVICES),
        rng=np.random.default_rng(0), now=0.0,
    )  # fmt: skip
    dubhe.open_round(third)  # the cap's counts come from the store
    for device in ("d0", "d1", "d2"):
        router.dispatch(
            Volunteer(federation=FED, round=3, sender=device, draws=(True,))
        )

    selection = dubhe.select(dataclasses.replace(third, now=10.0))

    # d0 was in rounds 1 and 2: 2 of 4 already; d1 and d3 once
    assert selection is not None and selection.selected == ("d1", "d2")
