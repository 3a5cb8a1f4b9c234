"""CLIMB's coordinator half: the dual step before a round trains (CLIMB, Alg. 1).

`ClimbDualStep` is a `ursa.coordinator.before_training.BeforeTraining` step:
in rounds 1, 1 + ``dual_period``, ... it runs CLIMB's dual step as a
`ursa.coordinator.secure_mean` of purpose ``climb.dual`` (`dual_wire`)::

    coordinator -> MeanRequest(climb.dual, round, key epoch, model, version) -> all
    device      -> MeanReport(Enc([f_i, lambda_i]))    (every registered device)
    [every registered online device reported, or dual_timeout_s]
    coordinator -> MeanSum(Enc(sum), num_parties) -> all

and then the round trains. Devices scale their deltas by their own weight
``w_i`` (`ursa.edge_sdk.methods.climb`), so the round averages them equally
and never rescales (`Weighting.CLIMB`): the coordinator never learns a loss,
a dual variable or a weight.

Asking, summing, saving and resuming are `ursa.coordinator.secure_mean_step`'s.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from ursa.coordinator.aggregation import Weighting
from ursa.coordinator.before_training import RoundInfo, StepContext
from ursa.coordinator.encrypted_sum import EncryptedSum
from ursa.coordinator.gather import Gather
from ursa.coordinator.methods.climb.wire import dual_wire
from ursa.coordinator.methods_config import ClimbSpec
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.secure_mean import MeanHead, MeanWire
from ursa.coordinator.secure_mean_step import SecureMeanStep
from ursa.protocol.messages import CLIMB_DUAL, MeanReport, ModelUpdate

__all__ = ["ClimbDualStep"]

logger = logging.getLogger("ursa.coordinator.climb")


class ClimbDualStep(SecureMeanStep):
    """CLIMB's encrypted dual step before the rounds that need one.

    Args:
        ctx: The training plugin's context.
        spec: The ``[[methods]]`` ``kind = "climb"`` table (timeout, period,
            the devices' codec bound on parties).
    """

    name: ClassVar[str] = "climb"
    weighting: ClassVar[Weighting | None] = Weighting.CLIMB

    def __init__(self, ctx: StepContext, spec: ClimbSpec | None = None) -> None:
        super().__init__(ctx)
        self.spec = spec or ClimbSpec()

    @property
    def purpose(self) -> str:
        """``climb.dual``."""
        return CLIMB_DUAL

    def is_due(self, round_index: int) -> bool:
        """Whether round ``round_index`` starts with a dual step."""
        return (round_index - 1) % self.spec.dual_period == 0

    def wire(self, info: RoundInfo) -> MeanWire:
        """``Enc([f_i, lambda_i])`` at the round's model version."""
        return dual_wire(info.model)

    def timeout_s(self) -> float:
        """The table's ``dual_timeout_s``."""
        return self.spec.dual_timeout_s

    def max_parties(self) -> int:
        """The table's ``max_parties`` (the devices' codec bound)."""
        return self.spec.max_parties

    def closed(self, head: MeanHead, mean: Gather[MeanReport, EncryptedSum]) -> None:
        """Log the dual step's outcome."""
        if mean.status is PhaseStatus.FALLBACK:
            logger.warning("round %d: no dual report; weights unchanged", head.round)
        else:
            logger.info(
                "round %d: dual step summed %d reports", head.round, len(mean.answered)
            )

    def on_update(self, round_index: int, device: str, message: ModelUpdate) -> None:
        """Note a device that did not scale its delta (it counts with w=1)."""
        if not message.delta_scaled:
            logger.info(
                "round %d: %s sent an unscaled delta (w=1)", round_index, device
            )
