"""Federated evaluation: the fleet's per-class accuracy, never a device's counts.

Every ``[evaluation] every`` rounds, before the round trains, the coordinator
asks a secure mean of purpose ``eval.classes`` (`SecureMeanStep`): each
registered online device reports ``Enc([correct_0 .. correct_{C-1}, total_0
.. total_{C-1}])`` over its local evaluation split at the round's model
version (the global model after the previous round). The coordinator sums
the reports blind and sends the sum; every device decrypts it, and the key
epoch's agent answers the decrypted totals in a signed `MeanResult`::

    coordinator -> MeanRequest(eval.classes, round r, epoch, version v) -> all
    device      -> MeanReport(Enc([correct.., total.., evaluated]))
    coordinator -> MeanSum(Enc(sum), num_parties) -> all
    agent       -> MeanResult(eval.classes, r, epoch, v, totals, num_parties)

The result lands in round r's record as ``federated_eval`` (version,
accuracy, per-class accuracy, parties, samples). The agent answers only a
sum of at least its configured number of parties (`ursa.edge_sdk.fleet_eval`);
the coordinator takes only the agent's, signed, for the sum it sent (same
head and party count), and only totals an honest fleet of that many parties
can sum to (`ursa.protocol.messages.evaluation.eval_totals_problem`).
Evaluation is a runtime step every device runs, not a method: it is not in
the signed method list.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from ursa.coordinator.agent_signature import require_agent_signed
from ursa.coordinator.before_training import RoundInfo, StepContext
from ursa.coordinator.config import EvaluationConfig
from ursa.coordinator.encrypted_sum import EncryptedSum
from ursa.coordinator.gather import Gather
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.secure_mean import MeanHead, MeanWire
from ursa.coordinator.secure_mean_step import SecureMeanStep
from ursa.protocol.messages import (
    FLEET_EVAL,
    ErrorCode,
    MeanReport,
    MeanResult,
    fleet_eval_length,
)
from ursa.protocol.messages.evaluation import (
    eval_totals_problem,
    fleet_eval_ciphertexts,
)
from ursa.protocol.router import RejectedError, Router

__all__ = ["FleetEvaluation", "fleet_accuracy"]

logger = logging.getLogger("ursa.coordinator.evaluation")


def fleet_accuracy(totals: tuple[float, ...]) -> dict[str, Any]:
    """Accuracy and per-class accuracy from summed ``[correct.., total.., evaluated]``.

    A class no device evaluated has accuracy None.
    """
    classes = (len(totals) - 1) // 2
    correct, total = totals[:classes], totals[classes : 2 * classes]
    samples = sum(total)
    return {
        "accuracy": None if samples <= 0 else sum(correct) / samples,
        "per_class": [
            None if t <= 0 else c / t for c, t in zip(correct, total, strict=True)
        ],
        "samples": round(samples),
        "evaluated": round(totals[-1]),
    }


class FleetEvaluation(SecureMeanStep):
    """The encrypted federated evaluation before every ``every``-th round.

    Args:
        ctx: The training plugin's context.
        config: The ``[evaluation]`` section.
        num_classes: The classifier's classes (two counts each per report).
        max_parties: The key epoch's ``max_parties`` (the devices' codec bound).
    """

    name: ClassVar[str] = "eval"
    signed: ClassVar[bool] = False

    def __init__(
        self,
        ctx: StepContext,
        config: EvaluationConfig,
        *,
        num_classes: int,
        max_parties: int,
    ) -> None:
        super().__init__(ctx)
        self.config = config
        self.num_classes = num_classes
        self._max_parties = max_parties
        self._summed: dict[int, tuple[MeanHead, int]] = {}
        self._result_due: dict[int, float] = {}
        self._results: dict[int, dict[str, Any]] = {}

    @property
    def purpose(self) -> str:
        """``eval.classes``."""
        return FLEET_EVAL

    def is_due(self, round_index: int) -> bool:
        """Rounds ``1 + every``, ``1 + 2 every``, ... (never with ``every = 0``)."""
        every = self.config.every
        return every > 0 and round_index > 1 and (round_index - 1) % every == 0

    def wire(self, info: RoundInfo) -> MeanWire | None:
        """``Enc([correct.., total.., evaluated])`` at the round's model version.

        Its ciphertext count follows from the protocol's codec, the key epoch's
        party bound and key size (None: no epoch key to size it by).
        """
        epoch = self.ctx.view.epoch_view()
        if epoch is None or epoch.public_key is None:
            return None
        count = fleet_eval_ciphertexts(
            self.num_classes, self._max_parties, epoch.public_key.key_bits
        )
        length = fleet_eval_length(self.num_classes)
        return MeanWire(FLEET_EVAL, length, info.model, count)

    def timeout_s(self) -> float:
        """The section's ``timeout_s``."""
        return self.config.timeout_s

    def max_parties(self) -> int:
        """The key epoch's party bound."""
        return self._max_parties

    def register(self, router: Router) -> None:
        """The reports, and the agent's decrypted result."""
        super().register(router)
        router.register(MeanResult, self._on_result, owner=self.name)

    def closed(self, head: MeanHead, mean: Gather[MeanReport, EncryptedSum]) -> None:
        """Wait for the agent's result of a sum that went out."""
        if mean.status is PhaseStatus.FALLBACK:
            logger.warning("round %d: no evaluation report", head.round)
            return
        self._summed[head.round] = (head, len(mean.answered))
        self._result_due[head.round] = self.ctx.clock() + self.config.timeout_s
        logger.info(
            "round %d: evaluation of version %d summed %d reports",
            head.round,
            head.version,
            len(mean.answered),
        )

    def awaits(self, round_index: int, now: float) -> bool:
        """The agent's result of a sum that went out, until ``timeout_s`` after it.

        A round whose devices train faster than the agent decrypts must not
        close without its evaluation (the result would come too late).
        """
        due = self._result_due.get(round_index)
        return due is not None and round_index not in self._results and now < due

    def refused(self, round_index: int, device: str) -> None:
        """The agent refused the round's sum: its result will not come."""
        epoch = self.ctx.view.epoch_view()
        if epoch is not None and device == epoch.agent:
            self._result_due.pop(round_index, None)

    def extend_deadlines(self, seconds: float) -> None:
        """The broker was away: the agent's result may come that much later."""
        super().extend_deadlines(seconds)
        for round_index in self._result_due:
            self._result_due[round_index] += seconds

    def metrics(self, round_index: int) -> Mapping[str, Any]:
        """``federated_eval`` once the agent answered this round's sum."""
        result = self._results.get(round_index)
        return {} if result is None else {"federated_eval": result}

    def close(self, round_index: int) -> None:
        """Forget the round's sum and result."""
        super().close(round_index)
        self._summed.pop(round_index, None)
        self._result_due.pop(round_index, None)
        self._results.pop(round_index, None)

    def _on_result(self, message: MeanResult) -> None:
        summed = self._summed.get(message.round)
        if message.purpose != FLEET_EVAL or summed is None:
            raise RejectedError(
                ErrorCode.LATE, f"round {message.round} awaits no evaluation result"
            )
        head, parties = summed
        require_agent_signed(self.ctx.view.epoch_view(), message)
        said = (message.epoch, message.model_version, message.num_parties)
        if said != (head.epoch, head.version, parties):
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"a result for (epoch, version, parties) {said}; the sum sent was "
                f"{(head.epoch, head.version, parties)}",
            )
        if len(message.values) != fleet_eval_length(self.num_classes):
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"{len(message.values)} values for {self.num_classes} classes",
            )
        problem = eval_totals_problem(message.values, parties)
        if problem is not None:  # the agent is one device: it proves nothing
            raise RejectedError(
                ErrorCode.MALFORMED, f"no honest sum of {parties} reports: {problem}"
            )
        if message.round in self._results:
            return  # a re-sent answer
        result = {
            "version": head.version,
            "parties": parties,
            **fleet_accuracy(message.values),
        }
        self._results[message.round] = result
        accuracy = result["accuracy"]
        logger.info(
            "round %d: federated evaluation of version %d over %d devices: accuracy %s",
            message.round,
            head.version,
            parties,
            "-" if accuracy is None else f"{accuracy:.4f}",
        )
