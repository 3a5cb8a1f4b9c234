"""Federated evaluation, device side: per-class counts in, the fleet's accuracy out.

When the coordinator asks a secure mean of purpose ``eval.classes``
(`ursa.coordinator.fleet_eval`), every registered device answers with its
per-class correct and total counts on its local evaluation split at the
requested global version, and a 1 for "I evaluated":
``Enc([correct.., total.., 1])``; a device without a split (or without a
model trainer) reports zeros, so the coordinator never waits for it. The
runtime (`ursa.edge_sdk.secure_mean`) encrypts, reports and decrypts; this
participant computes the counts and reads the sum.

Every device learns the fleet's accuracy from the decrypted sum
(`FleetEvaluator.last`). The key epoch's agent also tells the coordinator: it
answers the totals in a signed `MeanResult`, once per key epoch and round,
and only when at least ``min_parties`` devices in the sum evaluated (the
last value), so a sum of one device's counts is never disclosed by an honest
agent, however many devices without a split reported zeros beside it.

A sum is checked before it is kept or disclosed: each count in ``[0, K
MAX_EVAL_COUNT]``, ``evaluated`` in ``[0, K]``, and the cross-slot rules of
`ursa.protocol.messages.evaluation.eval_totals_problem` (no class more correct than
seen, no more samples than the evaluating devices can hold). One forged
report could otherwise claim a crowd of evaluating devices, so the agent
would disclose one honest device's counts; a sum that breaks a rule is
refused (`ursa.edge_sdk.secure_mean`) and neither kept nor disclosed.

`split_for_evaluation` holds out a device's evaluation split (seeded, so a
restarted device holds out the same samples).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk.mean_bounds import HonestRange, ImplausibleSumError
from ursa.edge_sdk.method import DeviceContext, DeviceMethod, model_trainer
from ursa.edge_sdk.secure_mean import FloatVector, MeanCodec, MeanParticipant
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    FLEET_EVAL,
    MAX_EVAL_COUNT,
    MeanRequest,
    MeanResult,
    MeanSum,
    fleet_eval_length,
)
from ursa.protocol.messages.evaluation import FLEET_EVAL_CODEC, eval_totals_problem
from ursa.protocol.router import Router

__all__ = ["FleetEval", "FleetEvaluator", "split_for_evaluation"]

logger = logging.getLogger("ursa.edge_sdk")

DEFAULT_MIN_PARTIES = 2
"""The fewest reports in a sum the agent discloses to the coordinator."""


@dataclass(frozen=True)
class FleetEval:
    """The fleet's evaluation of one global version, as a device decrypted it."""

    round: int
    model_version: int
    parties: int
    correct: tuple[float, ...]
    total: tuple[float, ...]
    evaluated: int
    """How many of the ``parties`` evaluated (the others had no split)."""

    @property
    def accuracy(self) -> float | None:
        """Correct over evaluated samples (None: nobody evaluated)."""
        samples = sum(self.total)
        return None if samples <= 0 else sum(self.correct) / samples


def split_for_evaluation(
    x: NDArray[Any], y: NDArray[np.int64], fraction: float, *, seed: int
) -> tuple[NDArray[Any], NDArray[np.int64], NDArray[Any], NDArray[np.int64]]:
    """``(x_train, y_train, x_eval, y_eval)``: ``fraction`` of the samples held out.

    Seeded, so the same device holds out the same samples after a restart; at
    least one sample stays for training.

    Raises:
        ValueError: ``fraction`` outside [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {fraction}")
    held = min(round(len(y) * fraction), len(y) - 1)
    order = np.random.default_rng(seed).permutation(len(y))
    train, held_out = np.sort(order[held:]), np.sort(order[:held])
    return x[train], y[train], x[held_out], y[held_out]


class FleetEvaluator(DeviceMethod, MeanParticipant):
    """The device's part in federated evaluation (a runtime step, not a method).

    Args:
        ctx: The device (epoch, trainer, downloads, outbox).
        min_parties: The fewest reports in a sum this device, as agent,
            discloses to the coordinator.
    """

    name: ClassVar[str] = "eval"
    purpose: ClassVar[str] = FLEET_EVAL

    def __init__(
        self, ctx: DeviceContext, min_parties: int = DEFAULT_MIN_PARTIES
    ) -> None:
        self.ctx = ctx
        """The device this method runs on."""
        if min_parties < 1:
            raise ValueError(f"min_parties must be >= 1, got {min_parties}")
        self.min_parties = min_parties
        self.last: FleetEval | None = None
        """The latest fleet evaluation this device decrypted."""
        self._disclosed: set[tuple[int, int]] = set()

    def register(self, router: Router) -> None:
        """No kinds of its own: the runtime's secure mean carries it."""

    # --- the mean -------------------------------------------------------------

    def mean_codec(self) -> MeanCodec:
        """Integer counts up to `MAX_EVAL_COUNT`: two per class, one device count."""
        epoch = self.ctx.epoch
        if epoch is None:  # SecureMeans asks only with an adopted epoch
            raise ValueError("no key epoch")
        classes = epoch.num_classes
        count = float(MAX_EVAL_COUNT)
        return MeanCodec(
            FLEET_EVAL_CODEC,
            epoch.max_parties,
            fleet_eval_length(classes),
            HonestRange(
                (0.0,) * fleet_eval_length(classes),
                (count,) * (2 * classes) + (1.0,),
                rounding=0.0,  # integers, exact at 0 fraction bits
            ),
        )

    def check_mean(self, result: MeanSum, totals: FloatVector) -> None:
        """Refuse counts no honest fleet sums to (`eval_totals_problem`).

        Raises:
            ImplausibleSumError: the rule the sum breaks.
        """
        problem = eval_totals_problem(totals.tolist(), result.num_parties)
        if problem is not None:
            raise ImplausibleSumError(problem)

    def takes_part(self, request: MeanRequest) -> bool:
        """Every registered device answers (zeros without a split)."""
        return self.ctx.epoch is not None

    def mean_values(self, request: MeanRequest) -> FloatVector | None:
        """``[correct.., total.., 1]`` at the requested version (None: downloading)."""
        epoch = self.ctx.epoch
        assert epoch is not None
        classes = epoch.num_classes
        trainer = model_trainer(self.ctx)
        if trainer is None or not trainer.evaluates:
            return np.zeros(fleet_eval_length(classes))
        arrays = self.ctx.model_arrays_at(request.model_version)
        if arrays is None:
            return None  # the runtime asks again on `on_model_ready`
        counts = trainer.class_counts(arrays)
        if counts is None:
            return np.zeros(fleet_eval_length(classes))
        total = np.minimum(_fit(counts.total, classes), MAX_EVAL_COUNT)
        correct = np.minimum(_fit(counts.correct, classes), total)
        evaluated = 1.0 if total.sum() > 0 else 0.0
        values: FloatVector = np.concatenate([correct, total, [evaluated]])
        return values

    def on_mean(self, result: MeanSum, totals: FloatVector) -> None:
        """Keep the fleet's figures; the agent discloses them to the coordinator."""
        values = np.maximum(np.rint(totals), 0.0)
        classes = (len(values) - 1) // 2
        self.last = FleetEval(
            result.round,
            result.model_version,
            result.num_parties,
            tuple(float(v) for v in values[:classes]),
            tuple(float(v) for v in values[classes : 2 * classes]),
            int(values[-1]),
        )
        accuracy = self.last.accuracy
        logger.info(
            "%s: fleet evaluation of version %d by %d of %d devices: accuracy %s",
            self.ctx.device_id,
            result.model_version,
            self.last.evaluated,
            result.num_parties,
            "-" if accuracy is None else f"{accuracy:.4f}",
        )
        self._disclose(result, values, self.last.evaluated)

    def _disclose(self, result: MeanSum, values: FloatVector, evaluated: int) -> None:
        ctx, epoch = self.ctx, self.ctx.epoch
        if epoch is None or epoch.agent != ctx.device_id:
            return
        head = (result.epoch, result.round)
        if head in self._disclosed:
            return
        if evaluated < self.min_parties:  # zeros of devices without a split hide nobody
            logger.warning(
                "%s: evaluation sum of round %d covers %d evaluating devices (< %d); "
                "not disclosed",
                ctx.device_id,
                result.round,
                evaluated,
                self.min_parties,
            )
            return
        self._disclosed.add(head)
        me = ctx.device_id
        answer = MeanResult(
            federation=ctx.federation,
            round=result.round,
            sender=me,
            message_id=derived_id(me, "mean_result", result.epoch, result.round),
            purpose=result.purpose,
            epoch=result.epoch,
            model=result.model,
            model_version=result.model_version,
            values=tuple(float(v) for v in values),
            num_parties=result.num_parties,
        )
        ctx.send(ctx.signed(answer))


def _fit(counts: NDArray[Any], classes: int) -> NDArray[np.float64]:
    """``counts`` as ``classes`` non-negative floats (cut or zero-padded)."""
    out = np.zeros(classes)
    given = np.asarray(counts, dtype=np.float64)[:classes]
    out[: len(given)] = np.maximum(given, 0.0)
    return out
