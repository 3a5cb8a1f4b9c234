"""Only the epoch's agent, signing with its identity, answers the coordinator."""

from __future__ import annotations

import pytest

from ursa.coordinator.agent_signature import require_agent_signed
from ursa.coordinator.plugin import EpochView
from ursa.crypto.identity import DeviceIdentity
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.messages import AgentAnswer, ErrorCode
from ursa.protocol.router import RejectedError

AGENT = DeviceIdentity.generate("d4")
OTHER = DeviceIdentity.generate("d0")
EPOCH = EpochView(
    epoch=1,
    public_key=None,
    registered=frozenset(),
    agent="d4",
    agent_identity=AGENT.public(),
)


def _answer(sender: str, signer: DeviceIdentity | None) -> AgentAnswer:
    answer = AgentAnswer(federation="f", round=1, sender=sender, best_try=0)
    if signer is None:
        return answer
    signed = answer.model_copy(update={"signature": signer.sign(signing_bytes(answer))})
    decoded = decode(encode(signed))  # as it arrives: after a bytes round-trip
    assert isinstance(decoded, AgentAnswer)
    return decoded


def test_the_agents_signed_answer_passes() -> None:
    require_agent_signed(EPOCH, _answer("d4", AGENT))


@pytest.mark.parametrize(
    ("epoch", "sender", "signer", "code"),
    [
        (None, "d4", AGENT, ErrorCode.UNAUTHORISED),  # no epoch yet
        (EPOCH, "d0", OTHER, ErrorCode.UNAUTHORISED),  # another device
        (EPOCH, "d4", None, ErrorCode.BAD_SIGNATURE),  # unsigned
        (EPOCH, "d4", OTHER, ErrorCode.BAD_SIGNATURE),  # signed by another key
    ],
)
def test_anything_else_is_refused(
    epoch: EpochView | None,
    sender: str,
    signer: DeviceIdentity | None,
    code: ErrorCode,
) -> None:
    with pytest.raises(RejectedError) as refused:
        require_agent_signed(epoch, _answer(sender, signer))
    assert refused.value.code is code
