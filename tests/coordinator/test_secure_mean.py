"""secure_mean: the encrypted mean equals the plaintext mean, across restarts."""

from __future__ import annotations

import json

import pytest

from ursa.coordinator.encrypted_sum import EncryptedSum
from ursa.coordinator.gather import Gather
from ursa.coordinator.methods.climb.wire import dual_wire
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.secure_mean import MeanHead, secure_mean
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.edge_sdk.methods.climb import dual as device_climb
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import (
    CLIMB_DUAL,
    BaseMessage,
    ErrorCode,
    MeanReport,
    MeanRequest,
    MeanSum,
)
from ursa.protocol.router import RejectedError

CONFIG = device_climb.ClimbConfig(max_parties=10)
HEAD = MeanHead("fed", 3, 1, 7)
DEVICES = ("d0", "d1", "d2")

Keys = tuple[PaillierPublicKey, PaillierSecretKey]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)  # test-only key size


class Outbox:
    def __init__(self) -> None:
        self.sent: list[BaseMessage] = []

    def __call__(self, message: BaseMessage, device: str | None) -> None:
        assert device is None
        self.sent.append(decode(encode(message)))  # the wire round trip


def stats(public: PaillierPublicKey, device: str, f: float, lam: float) -> MeanReport:
    report = device_climb.encrypt_dual_report(public, CONFIG, f, lam)
    return MeanReport(
        federation="fed", round=3, sender=device, purpose=CLIMB_DUAL, epoch=1,
        model="classifier", model_version=7, ciphertext=report.to_bytes(public),
    )  # fmt: skip


def open_mean(
    public: PaillierPublicKey, out: Outbox, saved: dict[str, object] | None = None
) -> Gather[MeanReport, EncryptedSum]:
    return secure_mean(
        dual_wire("classifier"),
        HEAD,
        key="climb.dual/classifier/3",
        public_key=public,
        registered=DEVICES,
        online=frozenset(DEVICES),
        max_parties=CONFIG.max_parties,
        now=0.0,
        timeout_s=60.0,
        send=out,
        saved=saved,
    )


def test_the_sum_decrypts_to_the_plaintext_mean_across_a_restart(keys: Keys) -> None:
    public, secret = keys
    out = Outbox()
    values = {"d0": (0.5, 0.0), "d1": (1.25, 2.0), "d2": (3.0, 0.75)}
    mean = open_mean(public, out)
    (request,) = out.sent
    assert isinstance(request, MeanRequest) and request.purpose == CLIMB_DUAL
    assert (request.round, request.epoch, request.model_version) == (3, 1, 7)
    assert request.model == "classifier"
    mean.offer("d0", stats(public, "d0", *values["d0"]), out)

    saved = json.loads(json.dumps(mean.to_record()))
    resumed = open_mean(public, out, saved)
    resumed.offer("d0", stats(public, "d0", 9.0, 9.0), out)  # re-sent: ignored
    for device in ("d1", "d2"):
        resumed.offer(device, stats(public, device, *values[device]), out)

    assert resumed.status is PhaseStatus.DONE
    summed = out.sent[-1]
    assert isinstance(summed, MeanSum) and summed.num_parties == 3
    assert (summed.purpose, summed.model_version) == (CLIMB_DUAL, 7)
    vector = encrypted_vector_from(summed.ciphertext, public)
    means = device_climb.decrypt_dual_means(secret, CONFIG, vector)
    assert means.mean_loss == pytest.approx(4.75 / 3, abs=1e-6)
    assert means.mean_lambda == pytest.approx(2.75 / 3, abs=1e-6)


def test_reports_are_refused_with_their_codes(keys: Keys) -> None:
    public, _ = keys
    other, _ = generate_keypair(512)
    out = Outbox()
    mean = open_mean(public, out)
    good = stats(public, "d0", 1.0, 0.0)

    def code(device: str, message: MeanReport) -> str:
        with pytest.raises(RejectedError) as info:
            mean.offer(device, message, out)
        return info.value.code

    assert code("d0", good.model_copy(update={"epoch": 2})) == ErrorCode.WRONG_EPOCH
    assert code("outsider", good) == ErrorCode.UNAUTHORISED
    assert code("d0", stats(other, "d0", 1.0, 0.0)) == ErrorCode.BAD_CIPHERTEXT
    assert code("d0", good.model_copy(update={"ciphertext": b"\0" * 8})) == (
        ErrorCode.BAD_CIPHERTEXT
    )
    assert code("d0", good.model_copy(update={"purpose": "feddisk.made_loss"})) == (
        ErrorCode.MALFORMED
    )
    assert code("d0", good.model_copy(update={"model_version": 6})) == ("wrong_version")
    assert code("d0", good.model_copy(update={"model": "made"})) == "wrong_version"
    mean.poll(60.0, out)
    assert mean.status is PhaseStatus.FALLBACK and len(out.sent) == 1
    assert code("d0", good) == ErrorCode.LATE


def test_a_saved_mean_of_another_epoch_is_asked_again(keys: Keys) -> None:
    public, _ = keys
    out = Outbox()
    mean = open_mean(public, out)
    mean.offer("d0", stats(public, "d0", 1.0, 0.0), out)
    saved = json.loads(json.dumps(mean.to_record()))
    saved["state"]["epoch"] = 2

    fresh = open_mean(public, out, saved)

    assert fresh.answered == set() and fresh.is_open


def test_a_report_of_another_ciphertext_count_is_refused_and_the_rest_sum(
    keys: Keys,
) -> None:
    """A first report of two ciphertexts used to make every later one unsummable."""
    public, secret = keys
    out = Outbox()
    mean = open_mean(public, out)
    good = stats(public, "d0", 1.0, 0.0)
    vector = encrypted_vector_from(good.ciphertext, public)
    doubled = type(vector)(
        vector.key_fingerprint, 2, 1, vector.ciphertexts + vector.ciphertexts
    )
    forged = good.model_copy(update={"ciphertext": doubled.to_bytes(public)})

    with pytest.raises(RejectedError, match=r"2 ciphertexts; a climb\.dual") as info:
        mean.offer("d0", forged, out)
    assert info.value.code == ErrorCode.BAD_CIPHERTEXT
    for device in ("d1", "d2"):
        mean.offer(device, stats(public, device, 2.0, 1.0), out)
    mean.poll(60.0, out)  # d0 never sent a usable report

    summed = out.sent[-1]
    assert isinstance(summed, MeanSum) and summed.num_parties == 2
    vector = encrypted_vector_from(summed.ciphertext, public)
    means = device_climb.decrypt_dual_means(secret, CONFIG, vector)
    assert (means.mean_loss, means.mean_lambda) == pytest.approx((2.0, 1.0))
