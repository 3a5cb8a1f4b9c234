"""FedDisk's loss step on the coordinator: blind sums, refusals, verdicts."""

from __future__ import annotations

import json

import pytest

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.feddisk_steps import MADE_LOSS_LENGTH, DualStepError, MadeLossStep
from ursa.coordinator.plugin import EpochView
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    add_encrypted,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.edge_sdk import made_loss
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.messages import MadeLoss, MadeLossSum, MadeVerdict

FED = "fed"
CODEC = made_loss.MadeLossCodec(max_parties=10)
AGENT = DeviceIdentity.generate("d0")
REGISTERED = frozenset({"d0", "d1", "d2"})

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
) -> MadeLoss:
    loss = made_loss.encrypt_made_loss(public, CODEC, nll, n).to_bytes(public)
    return MadeLoss(
        federation=FED,
        round=7,
        sender=device,
        epoch=epoch,
        model_version=version,
        loss=loss,
    )


def new_step(public: PaillierPublicKey) -> MadeLossStep:
    return MadeLossStep.open(
        7, epoch_view(public), "made", 4, max_parties=CODEC.max_parties
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


def test_report_length_agrees_with_the_device() -> None:
    assert MADE_LOSS_LENGTH == made_loss.MADE_LOSS_LENGTH


def test_sum_decrypts_to_the_weighted_mean_after_a_wire_round_trip(
    keys: Keys,
) -> None:
    public, secret = keys
    step = new_step(public)
    values = {"d0": (2.5, 10), "d1": (-1.0, 30), "d2": (4.0, 5)}

    request = step.request(FED)
    for device, (nll, n) in values.items():
        assert (
            step.add(device, report(public, device, nll, n)) is UpdateOutcome.ACCEPTED
        )
    result = step.result(FED)

    assert (request.round, request.epoch, request.model, request.model_version) == (
        7,
        3,
        "made",
        4,
    )
    assert result is not None and result.num_parties == 3
    wire = decode(encode(result))
    assert isinstance(wire, MadeLossSum) and wire.model_version == 4
    summed = encrypted_vector_from(wire.loss_sum, public)
    fleet = made_loss.decrypt_fleet_loss(secret, CODEC, summed)
    expected = sum(nll * n for nll, n in values.values()) / 45
    assert fleet.mean_nll == pytest.approx(expected, abs=1e-5)
    assert fleet.num_examples == 45 and fleet.num_parties == 3


def test_bad_reports_are_refused_with_their_code(keys: Keys) -> None:
    public, _ = keys
    other_public, _ = generate_keypair(512)
    step = new_step(public)
    one = made_loss.encrypt_made_loss(public, CODEC, 1.0, 3)
    two_parties = add_encrypted(public, one, one).to_bytes(public)
    good = report(public, "d1", 1.0, 3)

    cases = {
        "wrong_version": report(public, "d1", 1.0, 3, version=5),
        "wrong_epoch": report(public, "d1", 1.0, 3, epoch=2),
        "unauthorised": report(public, "outsider", 1.0, 3),
        "bad_ciphertext": good.model_copy(update={"loss": good.loss[:-3]}),
    }
    for code, message in cases.items():
        with pytest.raises(DualStepError) as info:
            step.add(message.sender, message)
        assert info.value.code == code
    for payload in (two_parties, report(other_public, "d1", 1.0, 3).loss):
        with pytest.raises(DualStepError) as info:
            step.add("d1", good.model_copy(update={"loss": payload}))
        assert info.value.code == "bad_ciphertext"
    assert step.reporters == frozenset()

    assert step.add("d1", good) is UpdateOutcome.ACCEPTED
    assert step.add("d1", report(public, "d1", 9.0, 3)) is UpdateOutcome.DUPLICATE
    step.mark_sent()
    with pytest.raises(DualStepError) as late:
        step.add("d2", report(public, "d2", 1.0, 3))
    assert late.value.code == "late"


def test_completion_counts_registered_online_devices_only(keys: Keys) -> None:
    public, _ = keys
    step = new_step(public)
    step.add("d0", report(public, "d0", 1.0, 3))

    assert not step.is_complete(frozenset({"d0", "d1", "other"}))
    assert step.is_complete(frozenset({"d0", "other"}))
    assert new_step(public).result(FED) is None


def test_a_step_survives_a_json_round_trip(keys: Keys) -> None:
    public, secret = keys
    step = new_step(public)
    step.add("d0", report(public, "d0", 2.0, 4))
    saved = json.loads(json.dumps(step.to_record()))

    resumed = MadeLossStep.resume_or_open(
        7, epoch_view(public), "made", 4, saved, max_parties=CODEC.max_parties
    )
    resumed.add("d1", report(public, "d1", 5.0, 4))
    result = resumed.result(FED)

    assert resumed.reporters == {"d0", "d1"}
    assert result is not None
    fleet = made_loss.decrypt_fleet_loss(
        secret, CODEC, encrypted_vector_from(result.loss_sum, public)
    )
    assert fleet.mean_nll == pytest.approx(3.5, abs=1e-5)
    for other in [(8, 3, 4), (7, 9, 4), (7, 3, 5)]:  # round, epoch, version
        fresh = MadeLossStep.resume_or_open(
            other[0],
            epoch_view(public, other[1]),
            "made",
            other[2],
            saved,
            max_parties=CODEC.max_parties,
        )
        assert fresh.reporters == frozenset() and fresh.round == other[0]


def test_the_agents_signed_verdict_is_accepted(keys: Keys) -> None:
    public, _ = keys
    step = new_step(public)
    with pytest.raises(DualStepError) as early:
        step.check_verdict(verdict(), epoch_view(public))
    assert early.value.code == "late"

    step.mark_sent()
    step.check_verdict(verdict(), epoch_view(public))  # no error
    step.check_verdict(decode(encode(verdict(best=4))), epoch_view(public))  # type: ignore[arg-type]


def test_bad_verdicts_are_refused_with_their_code(keys: Keys) -> None:
    public, _ = keys
    step = new_step(public)
    step.mark_sent()
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
        with pytest.raises(DualStepError) as info:
            step.check_verdict(message, view)
        assert info.value.code == code, message
