"""FedDisk's loss step on the coordinator: blind sums, refusals, verdicts."""

from __future__ import annotations

import json
from functools import partial

import pytest

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.encrypted_sum import EncryptedSum
from ursa.coordinator.gather import Gather
from ursa.coordinator.methods.feddisk.made_loss import check_verdict, made_loss_wire
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.secure_mean import MeanHead, secure_mean
from ursa.coordinator.wait import Wait
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    add_encrypted,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.edge_sdk.methods.feddisk import made_loss
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.messages import (
    MADE_LOSS,
    BaseMessage,
    MadeVerdict,
    MeanReport,
    MeanRequest,
    MeanSum,
)
from ursa.protocol.router import RejectedError

FED = "fed"
CODEC = made_loss.MadeLossCodec(max_parties=10)
AGENT = DeviceIdentity.generate("d0")
REGISTERED = frozenset({"d0", "d1", "d2"})
HEAD = MeanHead(FED, 7, 3, 4)

Keys = tuple[PaillierPublicKey, PaillierSecretKey]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)  # test-only key size


def epoch_view(public: PaillierPublicKey, epoch: int = 3) -> EpochView:
    return EpochView(epoch, public, REGISTERED, "d0", AGENT.public())


def report(
    public: PaillierPublicKey,
    device: str,
    nll: float,
    n: int,
    *,
    epoch: int = 3,
    version: int = 4,
) -> MeanReport:
    loss = made_loss.encrypt_made_loss(public, CODEC, nll, n).to_bytes(public)
    return MeanReport(
        federation=FED,
        round=7,
        sender=device,
        purpose=MADE_LOSS,
        epoch=epoch,
        model="made",
        model_version=version,
        ciphertext=loss,
    )


class Outbox:
    def __init__(self) -> None:
        self.sent: list[BaseMessage] = []

    def __call__(self, message: BaseMessage, device: str | None) -> None:
        self.sent.append(decode(encode(message)))  # the wire round trip


def new_step(
    public: PaillierPublicKey,
    out: Outbox,
    *,
    head: MeanHead = HEAD,
    online: frozenset[str] = REGISTERED,
    saved: dict[str, object] | None = None,
) -> Gather[MeanReport, EncryptedSum]:
    return secure_mean(
        made_loss_wire("made"),
        head,
        key="feddisk.made_loss/made/7",
        public_key=public,
        registered=REGISTERED,
        online=online,
        max_parties=CODEC.max_parties,
        now=0.0,
        timeout_s=60.0,
        send=out,
        saved=saved,
    )


def verdict(
    *,
    sender: str = "d0",
    signer: DeviceIdentity = AGENT,
    epoch: int = 3,
    version: int = 4,
    stop: bool = True,
    best: int = 3,
) -> MadeVerdict:
    message = MadeVerdict(
        federation=FED,
        round=7,
        sender=sender,
        epoch=epoch,
        model_version=version,
        stop=stop,
        best_version=best,
    )
    return message.model_copy(update={"signature": signer.sign(signing_bytes(message))})


def test_sum_decrypts_to_the_weighted_mean_after_a_wire_round_trip(
    keys: Keys,
) -> None:
    public, secret = keys
    out = Outbox()
    step = new_step(public, out)
    values = {"d0": (2.5, 10), "d1": (-1.0, 30), "d2": (4.0, 5)}

    for device, (nll, n) in values.items():
        outcome = step.offer(device, report(public, device, nll, n), out)
        assert outcome is UpdateOutcome.ACCEPTED

    request, result = out.sent
    assert isinstance(request, MeanRequest)
    assert (request.round, request.epoch, request.model, request.model_version) == (
        7,
        3,
        "made",
        4,
    )
    assert isinstance(result, MeanSum) and result.model_version == 4
    assert result.num_parties == 3
    summed = encrypted_vector_from(result.ciphertext, public)
    fleet = made_loss.decrypt_fleet_loss(secret, CODEC, summed)
    expected = sum(nll * n for nll, n in values.values()) / 45
    assert fleet.mean_nll == pytest.approx(expected, abs=1e-5)
    assert fleet.num_examples == 45 and fleet.num_parties == 3


def test_bad_reports_are_refused_with_their_code(keys: Keys) -> None:
    public, _ = keys
    other_public, _ = generate_keypair(512)
    out = Outbox()
    step = new_step(public, out)
    one = made_loss.encrypt_made_loss(public, CODEC, 1.0, 3)
    two_parties = add_encrypted(public, one, one).to_bytes(public)
    good = report(public, "d1", 1.0, 3)

    def code(device: str, message: MeanReport) -> str:
        with pytest.raises(RejectedError) as info:
            step.offer(device, message, out)
        return info.value.code

    cases = {
        "wrong_version": report(public, "d1", 1.0, 3, version=5),
        "wrong_epoch": report(public, "d1", 1.0, 3, epoch=2),
        "unauthorised": report(public, "outsider", 1.0, 3),
        "bad_ciphertext": good.model_copy(update={"ciphertext": good.ciphertext[:-3]}),
    }
    for expected, message in cases.items():
        assert code(message.sender, message) == expected
    for payload in (two_parties, report(other_public, "d1", 1.0, 3).ciphertext):
        assert code("d1", good.model_copy(update={"ciphertext": payload})) == (
            "bad_ciphertext"
        )
    assert step.answered == set()

    assert step.offer("d1", good, out) is UpdateOutcome.ACCEPTED
    assert step.offer("d1", report(public, "d1", 9.0, 3), out) is (
        UpdateOutcome.DUPLICATE
    )
    step.poll(60.0, out)
    assert code("d2", report(public, "d2", 1.0, 3)) == "late"


def test_completion_counts_registered_online_devices_only(keys: Keys) -> None:
    public, _ = keys
    out = Outbox()
    step = new_step(public, out, online=frozenset({"d0", "d1", "other"}))
    step.offer("d0", report(public, "d0", 1.0, 3), out)

    assert step.is_open
    step.track_online(frozenset({"d0", "other"}), out)
    assert step.status is PhaseStatus.DONE
    nobody = new_step(public, out, online=frozenset({"other"}))
    assert nobody.status is PhaseStatus.FALLBACK
    assert [type(m) for m in out.sent[-2:]] == [MeanSum, MeanRequest]


def test_a_step_survives_a_json_round_trip(keys: Keys) -> None:
    public, secret = keys
    out = Outbox()
    step = new_step(public, out)
    step.offer("d0", report(public, "d0", 2.0, 4), out)
    saved = json.loads(json.dumps(step.to_record()))

    resumed = new_step(public, out, saved=saved)
    resumed.offer("d1", report(public, "d1", 5.0, 4), out)
    resumed.poll(60.0, out)

    assert resumed.answered == {"d0", "d1"}
    result = out.sent[-1]
    assert isinstance(result, MeanSum)
    fleet = made_loss.decrypt_fleet_loss(
        secret, CODEC, encrypted_vector_from(result.ciphertext, public)
    )
    assert fleet.mean_nll == pytest.approx(3.5, abs=1e-5)
    for other in [
        MeanHead(FED, 8, 3, 4),
        MeanHead(FED, 7, 9, 4),
        MeanHead(FED, 7, 3, 5),
    ]:
        fresh = new_step(public, out, head=other, saved=saved)
        assert fresh.answered == set() and fresh.is_open


def agent_wait() -> Wait[MadeVerdict]:
    return Wait.open("feddisk.verdict/made/7", "d0", now=0.0, timeout_s=30.0)


def test_the_agents_signed_verdict_is_accepted(keys: Keys) -> None:
    public, _ = keys
    view = epoch_view(public)

    wait = agent_wait()
    wait.offer("d0", verdict(), lambda m: check_verdict(m, view, HEAD))
    assert wait.status is PhaseStatus.DONE
    again = decode(encode(verdict(best=4)))
    assert isinstance(again, MadeVerdict)
    check_verdict(again, view, HEAD)  # no error


def test_bad_verdicts_are_refused_with_their_code(keys: Keys) -> None:
    public, _ = keys
    other = DeviceIdentity.generate("d1")
    forged = verdict().model_copy(update={"stop": False})

    cases = [
        ("unauthorised", verdict(sender="d1", signer=other), epoch_view(public)),
        ("unauthorised", verdict(), None),
        ("bad_signature", verdict(signer=other), epoch_view(public)),
        ("bad_signature", forged, epoch_view(public)),
        ("wrong_epoch", verdict(epoch=2), epoch_view(public)),
        ("wrong_version", verdict(version=3), epoch_view(public)),
        ("malformed", verdict(best=5), epoch_view(public)),
    ]
    for code, message, view in cases:
        wait = agent_wait()
        with pytest.raises(RejectedError) as info:
            wait.offer(
                message.sender, message, partial(check_verdict, epoch=view, head=HEAD)
            )
        assert info.value.code == code, message
        assert wait.is_open
