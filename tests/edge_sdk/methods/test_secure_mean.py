"""SecureMeans (``edge_sdk/secure_mean.py``) on a fake context: dispatch by purpose.

Every encrypted path is checked against the plaintext after a bytes round trip.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np
import pytest

from ursa.crypto.encoding import FixedPoint
from ursa.crypto.paillier import (
    PaillierPublicKey,
    decrypt_real_sum,
    encrypt_reals,
    encrypted_vector_from,
    sum_encrypted,
)
from ursa.edge_sdk.mean_bounds import HonestRange, ImplausibleSumError
from ursa.edge_sdk.method import DeviceMethod
from ursa.edge_sdk.secure_mean import (
    FloatVector,
    MeanAbandonedError,
    MeanCodec,
    MeanParticipant,
    SecureMeans,
    with_secure_means,
)
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import ErrorReply, MeanReport, MeanRequest, MeanSum
from ursa.protocol.messages.secure_mean import MEAN_REFUSED
from ursa.protocol.router import Dispatch, Router

FED = "fed"
CODEC = MeanCodec(FixedPoint(bound=100.0), 10, 3)


class Toy(DeviceMethod, MeanParticipant):
    """Reports fixed values once its version is "here"; records what it gets."""

    name: ClassVar[str] = "toy"
    purpose: ClassVar[str] = "toy.a"

    def __init__(self, values: list[float]) -> None:
        self.values = np.array(values, dtype=np.float64)
        self.here: set[int] = set()
        self.gone = False
        self.means: list[tuple[MeanSum, FloatVector]] = []
        self.again: list[MeanSum] = []
        self.refused: list[MeanRequest] = []

    def register(self, router: Router) -> None:
        """No kinds of its own."""

    def mean_codec(self) -> MeanCodec:
        return CODEC

    def takes_part(self, request: MeanRequest) -> bool:
        return request.model == "m"

    def mean_values(self, request: MeanRequest) -> FloatVector | None:
        if self.gone:
            raise MeanAbandonedError("gone")
        return self.values if request.model_version in self.here else None

    def on_mean(self, result: MeanSum, totals: FloatVector) -> None:
        self.means.append((result, totals))

    def on_sum_again(self, result: MeanSum) -> None:
        self.again.append(result)

    def on_refused(self, request: MeanRequest) -> None:
        self.refused.append(request)


class OtherToy(Toy):
    """The same, for another purpose."""

    purpose: ClassVar[str] = "toy.b"


def request(purpose: str = "toy.a", round_index: int = 2, **kw: Any) -> MeanRequest:
    fields: dict[str, Any] = {
        "federation": FED, "round": round_index, "sender": "coordinator",
        "purpose": purpose, "epoch": 3, "model": "m", "model_version": 1,
    }  # fmt: skip
    fields.update(kw)
    return MeanRequest(**fields)


def total_of(
    public: PaillierPublicKey, reports: list[bytes], purpose: str = "toy.a"
) -> MeanSum:
    vectors = [encrypted_vector_from(r, public) for r in reports]
    total = sum_encrypted(public, vectors)
    return MeanSum(
        federation=FED, round=2, sender="coordinator", purpose=purpose, epoch=3,
        model="m", model_version=1, ciphertext=total.to_bytes(public),
        num_parties=len(reports),
    )  # fmt: skip


def attached(new_context: Any, *toys: Toy) -> tuple[Any, Router, SecureMeans]:
    ctx, router = new_context(), Router("d0")
    means = SecureMeans(ctx, toys)
    for toy in toys:
        toy.register(router)
    means.register(router)
    return ctx, router, means


def wire(message: Any) -> Any:
    return decode(encode(message))  # the bytes round trip


def test_a_report_is_the_plaintext_after_the_bytes_trip_and_the_sum_its_total(
    new_context: Any, keys: Any
) -> None:
    public, secret = keys
    a, b = Toy([1.5, -2.25, 7.0]), OtherToy([0.0, 1.0, 2.0])
    ctx, router, means = attached(new_context, a, b)
    router.dispatch(wire(request()))
    assert ctx.sent == []  # the version is not here yet
    a.here.add(1)
    means.on_model_ready()
    (report,) = [wire(m) for m in ctx.sent]
    assert isinstance(report, MeanReport) and report.purpose == "toy.a"
    assert (report.epoch, report.model, report.model_version) == (3, "m", 1)
    vector = encrypted_vector_from(report.ciphertext, public)
    plain = decrypt_real_sum(secret, CODEC.fixed_point, CODEC.max_parties, vector)
    np.testing.assert_allclose(plain, a.values, atol=1e-6)

    router.dispatch(wire(request()))  # re-published: the same report
    assert [m.message_id for m in ctx.sent] == [report.message_id] * 2

    other = encrypt_reals(public, CODEC.fixed_point, CODEC.max_parties, [2.5, 0, 1])
    router.dispatch(wire(total_of(public, [report.ciphertext, other.to_bytes(public)])))
    ((result, totals),) = a.means
    assert result.num_parties == 2 and b.means == []
    np.testing.assert_allclose(totals, a.values + np.array([2.5, 0, 1]), atol=1e-6)

    router.dispatch(wire(total_of(public, [report.ciphertext])))  # again: not twice
    assert len(a.means) == 1 and len(a.again) == 1


def test_purposes_stay_apart_and_unknown_ones_are_ignored(
    new_context: Any, keys: Any
) -> None:
    a, b = Toy([1.0, 2.0, 3.0]), OtherToy([4.0, 5.0, 6.0])
    a.here.add(1)
    b.here.add(1)
    ctx, router, _ = attached(new_context, a, b)
    router.dispatch(request("toy.b"))
    router.dispatch(request("toy.zzz"))
    router.dispatch(request("toy.a", model="other"))  # a does not take part
    (report,) = ctx.sent
    assert report.purpose == "toy.b"
    router.dispatch(request("toy.a"))
    ids = {m.purpose: m.message_id for m in ctx.sent}
    assert ids["toy.a"] != ids["toy.b"]  # the id derives from the purpose


def test_a_refusal_reaches_its_participant_only(new_context: Any, keys: Any) -> None:
    a = Toy([1.0, 2.0, 3.0])
    a.here.add(1)
    ctx, router, means = attached(new_context, a)
    router.dispatch(request())
    (report,) = ctx.sent
    refusal = ErrorReply(
        federation=FED, round=2, sender="coordinator", code="late",
        reason="closed", in_reply_to=report.message_id,
    )  # fmt: skip
    means.on_error_reply(refusal.model_copy(update={"in_reply_to": "f" * 32}))
    assert a.refused == []
    means.on_error_reply(refusal)
    assert [r.round for r in a.refused] == [2]
    router.dispatch(total_of(keys[0], [report.ciphertext]))
    assert a.means == [] and len(a.again) == 1  # the refused report got no sum


def test_without_the_secret_key_requests_and_sums_wait(
    new_context: Any, keys: Any
) -> None:
    a = Toy([1.0, 2.0, 3.0])
    a.here.add(1)
    ctx, router, _ = attached(new_context, a)
    held = ctx.epoch_keys
    ctx.epoch_keys = None
    assert router.dispatch(request()) is Dispatch.PARKED
    ctx.epoch_keys = held
    router.retry_parked(lambda message, exc: None)
    (report,) = ctx.sent
    ctx.epoch_keys = type(held)(held.notice, held.public_key, None, None)
    assert router.dispatch(total_of(keys[0], [report.ciphertext])) is Dispatch.PARKED


def test_an_abandoned_request_is_dropped(new_context: Any, keys: Any) -> None:
    a = Toy([1.0, 2.0, 3.0])
    ctx, router, means = attached(new_context, a)
    router.dispatch(request())
    a.gone = True
    means.on_model_ready()
    a.gone, a.here = False, {1}
    means.on_model_ready()
    assert ctx.sent == []


def test_one_participant_per_purpose_and_only_participants_get_the_runtime(
    new_context: Any,
) -> None:
    ctx = new_context()
    with pytest.raises(ValueError, match=r"two methods take part in mean 'toy\.a'"):
        SecureMeans(ctx, [Toy([1.0]), Toy([2.0])])
    toy = Toy([1.0])
    composed = with_secure_means(ctx, [toy])
    assert composed[0] is toy and isinstance(composed[1], SecureMeans)
    assert composed[1].purposes == ("toy.a",)
    assert composed[1].ctx is ctx
    assert with_secure_means(ctx, []) == []


class Bounded(Toy):
    """A participant whose honest reports hold [0, 10] per slot, sum of slot 0 even."""

    purpose: ClassVar[str] = "toy.bounded"
    HONEST = HonestRange.of((0.0, 0.0, 0.0), (10.0, 10.0, 10.0), CODEC.fixed_point)

    def mean_codec(self) -> MeanCodec:
        return MeanCodec(CODEC.fixed_point, CODEC.max_parties, 3, self.HONEST)

    def check_mean(self, result: MeanSum, totals: FloatVector) -> None:
        if round(totals[0]) % 2:
            raise ImplausibleSumError("slot 0 sums to an odd number")


def forged(public: PaillierPublicKey, values: list[float]) -> bytes:
    """One party's report of ``values``, encoded without the honest clamp."""
    return encrypt_reals(public, CODEC.fixed_point, CODEC.max_parties, values).to_bytes(
        public
    )


def bounded_report(
    new_context: Any, values: list[float]
) -> tuple[Any, Router, Bounded, MeanReport]:
    """A `Bounded` participant of d0 that reported ``values`` for round 2."""
    toy = Bounded(values)
    toy.here.add(1)
    ctx, router, _ = attached(new_context, toy)
    router.dispatch(request("toy.bounded"))
    (report,) = ctx.sent
    return ctx, router, toy, report


def refused_round(
    new_context: Any, keys: Any, other: list[float], *, parties: int | None = None
) -> tuple[Any, Bounded]:
    """d0 reports [2, 2, 2]; the sum adds ``other`` (as ``parties`` parties)."""
    public, _ = keys
    ctx, router, toy, report = bounded_report(new_context, [2.0, 2.0, 2.0])
    total = total_of(public, [report.ciphertext, forged(public, other)], "toy.bounded")
    if parties is not None:
        total = total.model_copy(update={"num_parties": parties})
    router.dispatch(wire(total))
    return ctx, toy


@pytest.mark.parametrize(
    ("other", "parties", "reason"),
    [
        ([95.0, 2.0, 2.0], None, r"slot 0 sums to 97 over 2 parties; honest .* 20"),
        ([2.0, -3.0, 2.0], None, r"slot 1 sums to -1 over 2"),
        ([2.0, 2.0, 3.0], 1, r"the vector sums 2 parties, the header 1"),
        ([2.0, 2.0, 3.0], 101, r"a sum over 101 parties; at most 10 can report"),
        ([1.0, 2.0, 2.0], None, r"slot 0 sums to an odd number"),
    ],
)
def test_a_sum_no_honest_fleet_makes_is_refused_reported_and_not_applied(
    new_context: Any, keys: Any, other: list[float], parties: int | None, reason: str
) -> None:
    ctx, toy = refused_round(new_context, keys, other, parties=parties)

    assert toy.means == [] and [r.round for r in toy.refused] == [2]
    refusal = ctx.sent[-1]
    assert isinstance(refusal, ErrorReply) and refusal.code == MEAN_REFUSED
    assert re.search(reason, refusal.reason), refusal.reason
    assert refusal.reason.startswith("toy.bounded sum refused: ")


def test_a_refused_sum_sent_again_is_not_refused_twice(
    new_context: Any, keys: Any
) -> None:
    public, _ = keys
    ctx, router, toy, report = bounded_report(new_context, [2.0, 2.0, 2.0])
    total = total_of(public, [report.ciphertext, forged(public, [99.0, 0, 0])])
    total = total.model_copy(update={"purpose": "toy.bounded"})
    router.dispatch(wire(total))
    router.dispatch(wire(total))

    assert [m.kind for m in ctx.sent] == ["mean_report", "error"]
    assert len(toy.refused) == 1 and len(toy.again) == 1


def test_an_honest_sum_at_the_edges_of_the_range_is_applied(
    new_context: Any, keys: Any
) -> None:
    ctx, toy = refused_round(new_context, keys, [10.0, 0.0, 10.0])

    ((_, totals),) = toy.means
    np.testing.assert_allclose(totals, [12.0, 2.0, 12.0], atol=1e-6)
    assert toy.refused == [] and [m.kind for m in ctx.sent] == ["mean_report"]


def test_a_sum_that_does_not_decrypt_is_refused_not_raised(
    new_context: Any, keys: Any
) -> None:
    public, _ = keys
    ctx, router, toy, report = bounded_report(new_context, [2.0, 2.0, 2.0])
    layout = CODEC.fixed_point.layout(CODEC.max_parties, public.key_bits)
    overflow = public.raw_encrypt(1 << (layout.slot_bits * 3))  # above the last slot
    vector = encrypted_vector_from(report.ciphertext, public)
    summed = type(vector)(
        vector.key_fingerprint,
        3,
        2,
        (vector.ciphertexts[0] * overflow % public.nsquare,),
    )
    total = total_of(public, [report.ciphertext], "toy.bounded").model_copy(
        update={"ciphertext": summed.to_bytes(public), "num_parties": 2}
    )

    router.dispatch(wire(total))

    assert toy.means == [] and len(toy.refused) == 1
    assert "does not decrypt" in ctx.sent[-1].reason


def test_values_beyond_the_honest_range_are_clamped_before_encryption(
    new_context: Any, keys: Any
) -> None:
    public, secret = keys
    _, _, _, report = bounded_report(new_context, [-4.0, 5.0, 60.0])
    vector = encrypted_vector_from(report.ciphertext, public)
    plain = decrypt_real_sum(secret, CODEC.fixed_point, CODEC.max_parties, vector)
    np.testing.assert_allclose(plain, [0.0, 5.0, 10.0], atol=1e-6)
