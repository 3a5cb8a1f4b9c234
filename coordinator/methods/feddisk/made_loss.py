"""FedDisk phase 1 over the wire, coordinator side: the MADE loss step's messages.

After a MADE round produced global version v, one loss step (docs/methods.md, FedDisk;
FedDisk, paper §IV-B) is a `ursa.coordinator.secure_mean` of purpose
``feddisk.made_loss`` (`made_loss_wire`), then a `ursa.coordinator.wait.Wait`
for the agent's verdict::

    coordinator -> MeanRequest(feddisk.made_loss, round, key epoch, model, v) -> all
    device      -> MeanReport(Enc([nll_i * n_i, n_i]))   (every registered device)
    [every registered online device reported, or the loss deadline]
    coordinator -> MeanSum(Enc(sum), num_parties) -> all
    the agent   -> MadeVerdict(epoch, v, stop, best), signed

The coordinator multiplies ciphertexts under the epoch's Paillier public key
and never sees a loss or a split size; devices decrypt the fleet's mean NLL
(`ursa.edge_sdk.methods.feddisk.made_loss`). Besides `secure_mean`'s refusals, a report
or a verdict for another version is ``wrong_version``; `check_verdict` refuses a
verdict the agent did not sign, or whose best version is newer than the one
judged. The flow (when to ask, what a verdict means) is
`ursa.coordinator.methods.feddisk.judging`.
"""

from __future__ import annotations

from ursa.coordinator.plugin import EpochView
from ursa.coordinator.secure_mean import MeanHead, MeanWire
from ursa.coordinator.training_round import WRONG_VERSION
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import (
    MADE_LOSS,
    MADE_LOSS_LENGTH,
    ErrorCode,
    MadeVerdict,
)
from ursa.protocol.messages.feddisk import MADE_LOSS_CIPHERTEXTS
from ursa.protocol.router import RejectedError

__all__ = [
    "check_verdict",
    "loss_step_key",
    "made_loss_wire",
    "verdict_key",
]


def loss_step_key(model: str, round_index: int) -> str:
    """The phase key of a round's loss step."""
    return f"feddisk.made_loss/{model}/{round_index}"


def verdict_key(model: str, round_index: int) -> str:
    """The phase key of a round's wait for the agent's verdict."""
    return f"feddisk.verdict/{model}/{round_index}"


def made_loss_wire(model: str) -> MeanWire:
    """The loss step of the global MADE ``model``: a mean of ``[nll_i * n_i, n_i]``."""
    return MeanWire(MADE_LOSS, MADE_LOSS_LENGTH, model, MADE_LOSS_CIPHERTEXTS)


def check_verdict(
    message: MadeVerdict, epoch: EpochView | None, head: MeanHead
) -> None:
    """Accept the agent's verdict on the loss step of ``head``, or raise why not.

    Who may send it is the `Wait`'s check; this one is about the content.

    Raises:
        RejectedError: the agent's keys are unknown (``unauthorised``), its
            signature does not verify (``bad_signature``), another epoch or
            version, or a best version newer than the one judged
            (``malformed``).
    """
    if epoch is None or epoch.agent_identity is None:
        raise RejectedError(ErrorCode.UNAUTHORISED, "the agent's keys are unknown")
    try:
        verify_signature(
            epoch.agent_identity, signing_bytes(message), message.signature
        )
    except CryptoError as exc:
        raise RejectedError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
    if message.epoch != head.epoch:
        raise RejectedError(
            ErrorCode.WRONG_EPOCH, f"key epoch {message.epoch}, step {head.epoch}"
        )
    if message.model_version != head.version:
        raise RejectedError(
            WRONG_VERSION,
            f"verdict on version {message.model_version}, judging {head.version}",
        )
    if message.best_version > head.version:
        raise RejectedError(
            ErrorCode.MALFORMED,
            f"best version {message.best_version} is newer than {head.version}",
        )
