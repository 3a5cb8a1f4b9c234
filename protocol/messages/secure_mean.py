"""The encrypted mean on the wire: one request / report / sum family for every purpose.

CLIMB's dual step (``climb.dual``: ``Enc([f_i, lambda_i])``) and FedDisk's
MADE loss step (``feddisk.made_loss``: ``Enc([nll_i * n_i, n_i])``) are the
same protocol, told apart by ``purpose``::

    coordinator -> MeanRequest(purpose, round, key epoch, model, version) -> all
    device      -> MeanReport(purpose, ..., Enc([v_1 .. v_length]))
    coordinator -> MeanSum(purpose, ..., Enc(sum), num_parties) -> all

The ciphertext is one packed Paillier fixed-point vector under the key
epoch's public key (`ursa.crypto.paillier`); the coordinator only multiplies
reports, devices decrypt the sum and divide by ``num_parties``.

A device refuses a sum that no honest fleet of ``num_parties`` could produce
(`ursa.edge_sdk.mean_bounds`): it applies nothing and answers an `ErrorReply`
with code `MEAN_REFUSED` (``in_reply_to`` the sum) naming the reason.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from ursa.protocol.messages.base import (
    CONTROL,
    BaseMessage,
    Blob,
    Count,
    Name,
    Positive,
)

__all__ = ["MEAN_REFUSED", "MeanHeader", "MeanReport", "MeanRequest", "MeanSum"]

MEAN_REFUSED = "mean_refused"
"""`ErrorReply.code` of a device that refused a decrypted sum as implausible."""


class MeanHeader(BaseMessage):
    """What every message of a mean names: the purpose, key epoch and model version.

    Not a kind of its own: `MeanRequest`, `MeanReport` and `MeanSum` are.
    """

    purpose: Name
    epoch: Count
    model: Name
    model_version: Count


class MeanRequest(MeanHeader):
    """Coordinator to all: report your values of ``purpose`` at this model version."""

    kind: Literal["mean_request"] = "mean_request"
    topic: ClassVar[str] = CONTROL


class MeanReport(MeanHeader):
    """Device to coordinator: its values, one party's packed Paillier vector."""

    kind: Literal["mean_report"] = "mean_report"
    topic: ClassVar[str] = CONTROL
    ciphertext: Blob


class MeanSum(MeanHeader):
    """Coordinator to all: the encrypted sum of every accepted report."""

    kind: Literal["mean_sum"] = "mean_sum"
    topic: ClassVar[str] = CONTROL
    ciphertext: Blob
    num_parties: Positive
