"""Training rounds on the coordinator: the `RoundPlugin` that makes the fleet learn.

Round r, after the signed selection (base version v = the latest checkpoint)::

    1  TransferManifest("<model>.v<v>") + Chunks -> each selected device
       (its down topic; once per device and version), or -> all (global)
       when every online device reads v first (the runtime's steps say so:
       `TrainingSteps.fleet_needs_model`); `ursa.coordinator.model_delivery`
    2  the runtime runs the methods' before-training steps
       (`ursa.coordinator.step_runner`) and then tells the plugin to train
       (`on_steps_done`); under secure aggregation its key steps run next
    3  ModelAvailable(r, v, transfer id, sha256) -> all (retained): the
       selected devices train from v (a device missing chunks, or a device
       that was not sent v and needs it, asks `ChunkRequest`, answered on its
       own down topic with the manifest and those chunks)
    4  device -> ModelUpdate(base_version=v, num_examples, delta inline, or
       transfer_id after an upload manifest + chunks) -> running weighted sum
       (`ursa.coordinator.aggregation`: FedAvg by num_examples, equal, or
       what a step says, `TrainingSteps.weighting`)
    5  [every selected online device answered, or the update deadline]
       v+1 = v + server_lr * mean delta (plain: each delta clipped to
       clip_norm and weight to max_examples, combined by aggregation_rule;
       secure: the unmasked sum checked against its survivors' bounds,
       `ursa.coordinator.secure_aggregation.sum_bounds`), checkpointed atomically
       (`ursa.coordinator.model_store`), the optional evaluation callback runs,
       the round is complete. No update at all: the model stays at v.

Refused with a logged reason and an `ErrorReply`: an update from a device
not selected in the round, for another model, from another base version
(``wrong_version``), a second update from a device (the first counts), a
malformed or mis-shaped delta, a late update (round aggregated; earlier
rounds are refused by the service as ``wrong_round``). Silent devices are
dropped at the deadline (and at once when their last will says offline); a
device whose training failed says so (``training_failed``) and is not waited
for either, so the round closes once every selected device updated or failed
(what did arrive is aggregated as usual; none: the model stays). Neither is
a device whose update was refused as unusable. A sum out of bounds, or a new
model holding NaN or inf (`ursa.coordinator.model_store.UnsafeModelError`), keeps
the version: one ERROR line names the round and its participants, and the
round's record says why (``refused``).
Upload chunks still missing are re-requested every ``retry_s``.

Restarts: the running sum (a model artefact file, `ursa.coordinator.model_store`)
is checkpointed after every accepted update, and secure aggregation keeps its
phase records in the coordinator's store (written in the transaction of the
message); `on_selected` for the same round (a restarted service) resumes
them and re-publishes what the round waits on. The coordinator
needs no torch: it starts from an initial weights file (see
`ursa.coordinator.model_store`) and evaluates only through the optional
``evaluate`` callback (the demo's uses torch, lazily).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ursa.coordinator.aggregation import (
    AggregationPolicy,
    AggregationRule,
    Weighting,
    finalize_aggregation,
    init_aggregation,
)
from ursa.coordinator.before_training import StepContext
from ursa.coordinator.clock import Clock
from ursa.coordinator.federation_end import FinalModel, fits_inline
from ursa.coordinator.model_delivery import ModelDelivery
from ursa.coordinator.model_store import ModelStore, UnsafeModelError, signed_spec
from ursa.coordinator.model_transfer import Uploads, model_notice
from ursa.coordinator.plugin import (
    PluginContext,
    RoundInfo,
    RoundOutcome,
    RoundPlugin,
    Send,
)
from ursa.coordinator.secure_aggregation.session import (
    SecureAggregation,
    check_accountant,
)
from ursa.coordinator.store import LAST_ROUND_PREFIX
from ursa.coordinator.training_round import (
    WRONG_VERSION,
    OpenRound,
    RoundPhase,
    TrainingConfig,
    summarise_device_metrics,
)
from ursa.models.weights import Arrays, spec_of, unflatten
from ursa.protocol.envelope import message_kind
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    Chunk,
    ChunkRequest,
    ErrorCode,
    MaskedUpdate,
    ModelAvailable,
    ModelSpec,
    TransferManifest,
)
from ursa.protocol.messages import ModelUpdate as UpdateMessage
from ursa.protocol.messages.secure_mean import MEAN_REFUSED
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.secure_aggregation import (
    MODEL_SEGMENT,
    float_names,
)

__all__ = [
    "WRONG_VERSION",
    "Evaluator",
    "RoundPhase",
    "TrainingConfig",
    "TrainingPlugin",
    "TrainingRoundReport",
]

logger = logging.getLogger("ursa.coordinator.training")

Evaluator = Callable[[int, int, Arrays], Mapping[str, Any]]
"""``evaluate(round, version, arrays) -> metrics``: the operator's or demo's hook."""


@dataclass(frozen=True)
class TrainingRoundReport:
    """What one training round did (for reports; no device data in it)."""

    round: int
    base_version: int
    version: int
    selected: tuple[str, ...]
    contributed: tuple[str, ...]
    dropped: tuple[str, ...]
    before_training: Mapping[str, int]
    """Devices that answered each before-training step, by method name."""
    elapsed_s: float
    metrics: Mapping[str, Any] = field(default_factory=dict)
    failed: tuple[str, ...] = ()
    """Selected devices that reported their training failed (``training_failed``),
    or whose update was refused as unusable (``malformed``)."""
    refused: str = ""
    """Why the round's aggregate was refused (out of bounds, unsafe model):
    the model stayed at ``base_version``. Empty: it was not."""


class TrainingPlugin(RoundPlugin):
    """FedAvg / equal training rounds over chunked model transfers.

    Args:
        ctx: The service's view and the runtime's before-training steps (the
            weighting a step sets, the round's metrics).
        federation: The federation id (messages carry it).
        state_dir: The coordinator's state directory (models go below it).
        config: The training configuration.
        initial_weights: A weights file adopted as version 0 when no
            checkpoint exists yet.
        evaluate: Called after every round with the new global model.
        on_round: Called with each finished round's record.
        clock: Seconds, for the phase deadlines (the service's clock).
        method: The training method devices run when no step names one
            (``fedavg``; ``fedprox`` aggregates as FedAvg too).
        delivery: Who gets which model version (default: one made from
            ``config``'s chunk size and fetch bound).

    Raises:
        ModelStoreError: no checkpoint and no (usable) initial weights.
    """

    def __init__(
        self,
        ctx: PluginContext,
        *,
        federation: str,
        state_dir: Path,
        config: TrainingConfig | None = None,
        initial_weights: Path | None = None,
        evaluate: Evaluator | None = None,
        on_round: Callable[[TrainingRoundReport], None] | None = None,
        clock: Clock = time.time,
        method: str = "fedavg",
        delivery: ModelDelivery | None = None,
    ) -> None:
        self.config = config or TrainingConfig()
        self._method = method
        self._view = ctx.view
        self._steps = ctx.steps
        if self.config.aggregation.secure:
            check_accountant(self.config.aggregation)
        else:
            logger.warning(
                '%s: [aggregation] mode = "plain": the coordinator sees every '
                "device's model update (for debugging only)",
                self.config.model,
            )
        self._weighting = ctx.steps.weighting or self.config.weighting
        self._federation = federation
        self._store = ModelStore(
            state_dir, self.config.model, keep=self.config.keep_versions
        )
        if initial_weights is not None:
            self._store.import_initial(initial_weights)
        latest = self._store.latest()
        if latest is None:
            raise ValueError(
                f"no checkpoint of {self.config.model!r} in {self._store.path} and "
                "no initial weights file (write one with the train extra)"
            )
        self._latest = latest
        self._arrays = self._store.load_arrays(latest)
        self._payload = self._store.load_bytes(latest)
        self._spec = signed_spec(self.config.model, self._arrays)
        self._evaluate = evaluate
        self._on_round = on_round
        self._clock = clock
        self._send: Send | None = None
        self._delivery = delivery or ModelDelivery(
            federation,
            self.config.model,
            chunk_size=self.config.chunk_size,
            max_requests=self.config.max_chunk_requests,
        )
        self._secure: SecureAggregation | None = None
        self._secure_router = Router(COORDINATOR)
        if self.config.aggregation.secure:
            self._secure = SecureAggregation(
                StepContext(federation, ctx.view, self._emit, clock),
                self.config.aggregation,
                model=self.config.model,
                state_dir=state_dir,
                weighting=lambda: self._weighting.value,
            )
            self._secure.register(self._secure_router)
        self._open: OpenRound | None = None
        self.history: list[TrainingRoundReport] = []

    # --- public view ----------------------------------------------------------

    @property
    def version(self) -> int:
        """The latest global model version."""
        return self._latest.version

    @property
    def global_arrays(self) -> Arrays:
        """The latest global model (float32 arrays)."""
        return dict(self._arrays)

    @property
    def store(self) -> ModelStore:
        """The checkpoint store."""
        return self._store

    @property
    def weighting(self) -> Weighting:
        """How the rounds average updates (the config's, or a step's)."""
        return self._weighting

    @property
    def secure_aggregation(self) -> SecureAggregation | None:
        """The rounds' secure aggregation (None: plain sums)."""
        return self._secure

    # --- RoundPlugin ------------------------------------------------------------

    def on_selected(
        self, round_index: int, selected: tuple[str, ...], send: Send
    ) -> None:
        """Publish the model; the round waits for the steps (`on_steps_done`)."""
        self._send = send
        current = self._open
        if current is not None and current.index == round_index:
            self._republish(current)
            return
        if current is not None and current.phase is not RoundPhase.DONE:
            self._finish(current, "the next round opened")
        now = self._clock()
        base = self._latest
        aggregation = self._store.load_partial(round_index, base.version)
        if aggregation is None:
            aggregation = init_aggregation(
                self._arrays, self._weighting, self._plain_policy()
            )
        uploads = Uploads(
            max_transfer_bytes=self.config.max_update_bytes,
            max_total_bytes=self.config.max_update_bytes * max(1, len(selected)),
        )
        work = OpenRound(
            round_index,
            self.config.model,
            base.version,
            self._arrays,
            selected,
            RoundPhase.BEFORE,
            now + self.config.update_timeout_s,
            aggregation,
            uploads,
            now,
        )
        self._open = work
        if base.round == round_index and base.version > 0:
            work.phase = RoundPhase.DONE  # aggregated just before a restart
            return
        self._deliver(round_index, self._audience(round_index, selected))

    def round_info(self, round_index: int) -> RoundInfo | None:
        """The open round's model and base version, while it waits on the steps."""
        work = self._open
        if work is None or work.index != round_index:
            return None
        if work.phase is not RoundPhase.BEFORE:
            return None
        return RoundInfo(work.index, work.model, work.base_version, work.selected)

    def on_steps_done(self, round_index: int, send: Send) -> None:
        """The runtime's steps are done: secure aggregation's keys, then train."""
        self._send = send
        work = self._open
        if work is None or work.index != round_index:
            return
        if work.phase is RoundPhase.BEFORE:
            self._open_keys(work, self._clock())

    def on_message(self, round_index: int, message: BaseMessage, send: Send) -> None:
        """Route a training-phase message (refusals raise `RejectedError`)."""
        self._send = send
        device = message.sender
        if isinstance(message, ChunkRequest):
            self._on_chunk_request(device, message, send)
            return
        work = self._open
        if work is None or work.index != round_index:
            raise RejectedError(ErrorCode.LATE, f"round {round_index} is not training")
        if self._secure_router.dispatch(message) is not Dispatch.UNHANDLED:
            self._after_keys_event(work, self._clock())
        elif isinstance(message, UpdateMessage | MaskedUpdate):
            secure = self._secure
            if (secure is None) != isinstance(message, UpdateMessage):
                why = (
                    "this federation sums plain updates"
                    if secure is None
                    else "this federation sums updates securely: send a masked_update"
                )
                raise RejectedError(ErrorCode.UNAUTHORISED, why)
            counted = (
                work.aggregation.device_ids
                if secure is None
                else secure.contributors(work.index)
            )
            payload = work.receive(device, message, self._clock(), counted)
            if payload is not None:
                self._take(work, device, message, payload)
        elif isinstance(message, TransferManifest | Chunk):
            completed = work.receive_upload(device, message)
            if completed is not None:
                self._take(work, device, *completed)
        else:
            kind = message_kind(message)
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"a device may not send {kind} now"
            )
        self._maybe_finish(work)

    def on_tick(self, round_index: int, now: float, send: Send) -> None:
        """Tick the key steps; close the round at its deadline; re-request chunks."""
        self._send = send
        work = self._open
        if work is None or work.index != round_index:
            return
        if work.phase is RoundPhase.BEFORE:
            if work.keys_opened and self._secure is not None:
                self._secure.on_tick(round_index, now)
                self._after_keys_event(work, now)
            return
        if work.phase is RoundPhase.UNMASK:
            assert self._secure is not None
            self._secure.on_tick(round_index, now)
            self._maybe_finish(work)
            return
        if work.phase is not RoundPhase.TRAIN:
            return
        if now >= work.deadline_at:
            self._updates_closed(work, "the update deadline passed")
            return
        self._maybe_finish(work)
        for device, request in work.stale_uploads(
            now, self.config.retry_s, self._federation
        ):
            self._emit(request, device)

    def extend_deadlines(self, seconds: float) -> None:
        """The open round's key steps and update deadline wait ``seconds`` longer.

        The methods' steps are the runtime's (`ursa.coordinator.step_runner`).
        """
        work = self._open
        if work is None or work.phase is RoundPhase.DONE or seconds <= 0:
            return
        if self._secure is not None and work.phase is not RoundPhase.TRAIN:
            self._secure.extend_deadlines(seconds)
        work.deadline_at += seconds

    def on_device_failed(self, round_index: int, device: str, code: str) -> None:
        """Stop waiting for a device whose training failed; close once none is left.

        A refused mean's sum (``mean_refused``) is the runtime's steps' (the
        device still trains): the round only looks again whether it may close.
        """
        work = self._open
        if code == MEAN_REFUSED:
            if work is not None and work.index == round_index:
                self._maybe_finish(work)
            return
        if work is None or work.index != round_index or not work.fail(device):
            return
        logger.warning(
            "round %d: %s reports %s; not waiting for it", round_index, device, code
        )
        self._maybe_finish(work)

    def round_outcome(self, round_index: int) -> RoundOutcome | None:
        """Its record's contributed and failed devices (None: not finished here)."""
        for record in reversed(self.history):
            if record.round == round_index:
                return RoundOutcome(
                    frozenset(record.contributed), frozenset(record.failed)
                )
        return None

    def last_metrics(self) -> Mapping[str, Any]:
        """The last round's evaluation (empty before the first or without one)."""
        return self.history[-1].metrics if self.history else {}

    def final_model(self, send: Send) -> FinalModel:
        """The latest version, with its figures; its chunks to all unless inline.

        A final model that fits the `FederationEnd` (`fits_inline`) reaches
        every device in it, so its chunks are only kept for a fetch; a larger
        one goes to all as a transfer.
        """
        self._send = send
        last = self.history[-1] if self.history else None
        last_round = 0 if last is None else last.round
        if fits_inline(self._payload):
            self._delivery.keep(self._latest.version, self._payload, last_round)
        else:
            self._deliver(last_round, None)
        version = self._latest.version
        metrics = last.metrics if last is not None and last.version == version else {}
        return FinalModel(
            self.config.model,
            version,
            model_transfer_id(self._federation, self.config.model, version),
            self._payload,
            dict(self._arrays),
            metrics,
        )

    def model_spec(self) -> ModelSpec | None:
        """The model's tensor spec (every version has the initial one's)."""
        return self._spec

    def aggregation_mode(self) -> Literal["secure", "plain"]:
        """``secure`` (masked sums) or ``plain``, as its configuration says."""
        return self.config.aggregation.mode

    def methods(self) -> tuple[str, ...]:
        """The training method devices must run: the steps' methods, else `method`."""
        return self._steps.methods() or (self._method,)

    def is_complete(self, round_index: int) -> bool:
        """Whether the round has been aggregated (or ended without updates)."""
        work = self._open
        if work is None or work.index < round_index:
            return False
        return work.index > round_index or work.phase is RoundPhase.DONE

    # --- publishing ---------------------------------------------------------------

    def publish_latest(self, round_index: int, send: Send) -> None:
        """Send the latest version's chunks to all now (once per version, globally).

        For a plugin that needs devices to hold the model before a round
        trains from it (FedDisk's loss step); chunk requests for it are
        answered here as usual.
        """
        self._send = send
        self._deliver(round_index, None)

    def _audience(
        self, round_index: int, selected: Sequence[str]
    ) -> Sequence[str] | None:
        """Who gets the round's model: its selected devices, or all (None)."""
        if self._steps.fleet_needs_model(round_index):
            return None
        return selected

    def _deliver(self, round_index: int, to: Sequence[str] | None) -> None:
        """The latest version's chunks to ``to`` (None: all), once per recipient."""
        for message, device in self._delivery.deliveries(
            self._latest.version, self._payload, round_index, to
        ):
            self._emit(message, device)

    def _notice(self, work: OpenRound) -> ModelAvailable:
        # a round trains from the latest version: only its own end makes a newer one
        latest = self._latest
        assert work.base_version == latest.version, "a round's base is the latest"
        return model_notice(
            self._federation,
            self.config.model,
            work.index,
            latest.version,
            latest.sha256,
        )

    def _republish(self, work: OpenRound) -> None:
        if work.phase is RoundPhase.DONE:
            return
        self._delivery.redeliver()
        self._deliver(work.index, self._audience(work.index, work.selected))
        if work.keys_opened and self._secure is not None:
            self._secure.republish(work.index)
        if work.phase is RoundPhase.TRAIN:
            self._emit(self._notice(work), None)

    def _emit(self, message: BaseMessage, device: str | None) -> None:
        if self._send is not None:
            self._send(message, device)

    def _start_training(self, work: OpenRound, now: float) -> None:
        secure = self._secure
        why = None if secure is None else secure.abandoned(work.index)
        if why is not None:
            work.phase = RoundPhase.TRAIN
            self._finish(work, f"secure aggregation abandoned: {why}")
            return
        if secure is not None and secure.unmasking(work.index):
            work.phase = RoundPhase.UNMASK  # resumed after a restart
            return
        work.phase = RoundPhase.TRAIN
        work.deadline_at = now + self.config.update_timeout_s
        self._emit(self._notice(work), None)
        self._maybe_finish(work)

    # --- secure aggregation's key steps -----------------------------------------

    def _open_keys(self, work: OpenRound, now: float) -> None:
        """Secure aggregation's key steps (resumed after a restart); then train."""
        secure = self._secure
        if secure is not None and not work.keys_opened:
            work.keys_opened = True
            info = RoundInfo(work.index, work.model, work.base_version, work.selected)
            secure.open(info, now)
        self._after_keys_event(work, now)

    def _after_keys_event(self, work: OpenRound, now: float) -> None:
        """Once the key steps are done (or there are none), train."""
        if work.phase is not RoundPhase.BEFORE:
            return
        secure = self._secure
        if secure is None or (work.keys_opened and secure.is_done(work.index)):
            self._start_training(work, now)

    def _online(self) -> Set[str]:
        return self._view.online_devices()

    # --- updates ------------------------------------------------------------------

    def _accepted(self, work: OpenRound, device: str, message: UpdateMessage) -> None:
        if message.metrics:
            work.device_metrics[device] = dict(message.metrics)
        self._steps.on_update(work.index, device, message)
        self._store.save_partial(work.index, work.base_version, work.aggregation)
        logger.info(
            "round %d: update %d/%d from %s (%d examples)",
            work.index,
            work.aggregation.num_updates,
            len(work.selected),
            device,
            message.num_examples,
        )

    def _take(
        self,
        work: OpenRound,
        device: str,
        message: UpdateMessage | MaskedUpdate,
        payload: bytes,
    ) -> None:
        """A complete update into the round's sum: masked, or a plain delta."""
        if isinstance(message, MaskedUpdate):
            self._add_masked(work, device, payload)
        elif work.apply(device, message, payload):
            self._accepted(work, device, message)

    def _add_masked(self, work: OpenRound, device: str, payload: bytes) -> None:
        """One masked vector into the round's sum (never decoded alone)."""
        assert self._secure is not None
        if self._secure.add(work.index, device, payload, _float_values(work)):
            logger.info(
                "round %d: update %d/%d from %s (masked)",
                work.index,
                len(self._secure.contributors(work.index)),
                len(self._secure.expected(work.index)),
                device,
            )

    def _maybe_finish(self, work: OpenRound) -> None:
        if work.phase is RoundPhase.UNMASK:
            assert self._secure is not None
            if not self._secure.unmasking(work.index):
                self._finish(work, "the survivors' shares unmasked the sum")
            return
        if work.phase is not RoundPhase.TRAIN:
            return
        online = self._online()
        secure = self._secure
        if secure is None:
            waiting = work.waiting(online)
        else:
            waiting = work.waiting(
                online,
                expected=secure.expected(work.index),
                answered=secure.contributors(work.index),
            )
        if not waiting and self._steps.awaits(work.index, self._clock()):
            return  # a step's own figure (the fleet's evaluation) is on its way
        if not waiting:
            why = "every selected online device answered"
            if work.failed:
                why += f" or failed ({len(work.failed)} failed)"
            self._updates_closed(work, why)

    def _updates_closed(self, work: OpenRound, why: str) -> None:
        """No more updates: finish (plain), or unmask what arrived (secure)."""
        secure = self._secure
        if secure is None:
            self._finish(work, why)
            return
        secure.begin_unmask(work.index, self._clock())
        if secure.unmasking(work.index):
            work.phase = RoundPhase.UNMASK
            logger.info(
                "round %d: %s; unmasking the sum of %d devices",
                work.index,
                why,
                len(secure.contributors(work.index)),
            )
            return
        self._finish(work, why)

    def _finish(self, work: OpenRound, why: str) -> None:
        """Aggregate what arrived, check it, checkpoint, evaluate; the round is done."""
        state = work.aggregation
        secure_sums: Mapping[str, Any] | None = None
        refused = ""
        if self._secure is None:
            counted = set(state.device_ids)
            answered = set(counted)
            new = (
                finalize_aggregation(
                    state, work.base_arrays, server_lr=self.config.server_lr
                )
                if state.num_updates
                else None
            )
        else:
            unmasked = self._secure.unmasked(work.index, _float_values(work))
            answered = set(unmasked.survivors)
            counted = set()
            new = None
            if unmasked.sums is not None and unmasked.checked is not None:
                secure_sums = unmasked.sums
                new = self._secure_model(work, unmasked.sums, unmasked.checked.weight)
                counted = answered
            elif unmasked.out_of_bounds:
                refused = unmasked.why
            else:
                logger.warning(
                    "round %d: no secure sum (%s); the model stays at version %d",
                    work.index,
                    unmasked.why,
                    work.base_version,
                )
        version = work.base_version
        if new is not None:
            try:
                self._latest = self._store.save(
                    version + 1, new, round_index=work.index, like=work.base_arrays
                )
            except UnsafeModelError as exc:
                refused = f"the new model is unsafe: {exc}"
                new = None
                secure_sums = None
            else:
                version += 1
                self._arrays = new
                self._payload = self._store.load_bytes(self._latest)
        if refused:
            logger.error(
                "round %d: aggregate refused, %s; the model stays at version %d "
                "(participants %s)",
                work.index,
                refused,
                version,
                ", ".join(sorted(answered)),
            )
            counted = set()
            secure_sums = None
        elif new is None and self._secure is None:
            logger.warning(
                "round %d: no update arrived; the model stays at version %d",
                work.index,
                version,
            )
        contributed = tuple(sorted(counted))
        gone = (work.failed | work.refused) - answered
        failed = tuple(sorted(gone))
        dropped = tuple(sorted(set(work.selected) - answered - gone))
        if dropped:
            logger.warning("round %d: dropped silent devices %s", work.index, dropped)
        work.close()
        self._store.clear_round(work.index)
        metrics: dict[str, Any] = dict(self._steps.metrics(work.index))
        if self._secure is not None:
            metrics.update(self._secure.metrics(work.index))
            self._secure.close(work.index)
        if work.device_metrics:
            metrics["devices"] = summarise_device_metrics(work.device_metrics)
        if secure_sums is not None:
            fleet = fleet_metrics(secure_sums)
            if fleet:
                metrics["devices"] = fleet
        if self._evaluate is not None:
            try:
                metrics.update(self._evaluate(work.index, version, self._arrays))
            except Exception:
                logger.exception("round %d: evaluation failed", work.index)
        record = TrainingRoundReport(
            work.index,
            work.base_version,
            version,
            work.selected,
            contributed,
            dropped,
            self._steps.answered(work.index),
            self._clock() - work.started_at,
            metrics,
            failed,
            refused,
        )
        self.history.append(record)
        self._view.store.set_meta(  # for `ursa coordinator status`
            LAST_ROUND_PREFIX + self.config.model,
            json.dumps(round_figures(record), allow_nan=False),
        )
        logger.info(
            "round %d: %d updates -> version %d (%s)",
            work.index,
            len(contributed),
            version,
            why,
        )
        if self._on_round is not None:
            try:
                self._on_round(record)
            except Exception:
                logger.exception("round %d: on_round callback failed", work.index)

    def _secure_model(
        self, work: OpenRound, sums: Mapping[str, Any], weight: float
    ) -> Arrays:
        """``global + server_lr * model_sum / weight``.

        ``weight``: the weight sum once `SumBounds` checked the sum (clamped to
        ``[survivors, survivors * max_examples]`` under FedAvg, ``survivors``
        otherwise), so DP noise on the weight slot (or a device's lie) cannot
        blow the step up; the check bounds the step's norm by about ``clip_norm``.
        """
        flat = np.asarray(sums[MODEL_SEGMENT], dtype=np.float64)
        base = work.base_arrays
        floats = {name: base[name] for name in float_names(base)}
        step = unflatten(self.config.server_lr * flat / weight, spec_of(floats))
        out: Arrays = {name: np.asarray(a).copy() for name, a in base.items()}
        for name, delta in step.items():
            arr = np.asarray(base[name])
            out[name] = (arr.astype(np.float64) + delta).astype(arr.dtype)
        return out

    def _plain_policy(self) -> AggregationPolicy | None:
        """Plain mode: the coordinator clips each update and weight itself."""
        if self._secure is not None:
            return None
        config = self.config.aggregation
        return AggregationPolicy(
            AggregationRule(config.aggregation_rule),
            clip_norm=config.clip_norm,
            max_examples=config.max_examples,
            trim_fraction=config.trim_fraction,
        )

    # --- downloads ----------------------------------------------------------------

    def _on_chunk_request(self, device: str, request: ChunkRequest, send: Send) -> None:
        """A device fetches a current version (its chunks go to it alone)."""
        for reply in self._delivery.answer(device, request, self._clock()):
            send(reply, device)


def _float_values(work: OpenRound) -> int:
    """How many float values the round's model has (its secure vector's model part)."""
    base = work.base_arrays
    return sum(int(np.size(base[name])) for name in float_names(base))


def fleet_metrics(sums: Mapping[str, Any]) -> dict[str, float]:
    """The fleet's training figures out of a secure sum (none under DP).

    The same shape as plain rounds' `summarise_device_metrics`: mean loss and
    training time over the reporting devices, total samples.
    """
    if "reporting" not in sums:
        return {}
    reporting = float(np.asarray(sums["reporting"]).sum())
    if reporting < 0.5:
        return {}
    out = {"reporting": float(round(reporting))}
    for name in ("loss", "train_s"):
        out[name] = float(np.asarray(sums[name]).sum()) / reporting
    out["samples"] = float(np.asarray(sums["samples"]).sum())
    return out


def round_figures(record: TrainingRoundReport) -> dict[str, Any]:
    """A round's figures as an operator reads them (JSON-able, no device data).

    Updates counted, dropped and failed, the version made, wall time, the
    server's held-out accuracy and the federated one when known, and the
    devices' mean training metrics.
    """
    metrics = record.metrics

    def number(value: Any) -> float | None:
        ok = isinstance(value, int | float) and math.isfinite(value)
        return float(value) if ok else None

    federated = metrics.get("federated_eval")
    devices = metrics.get("devices")
    privacy = metrics.get("privacy")
    return {
        "round": record.round,
        "version": record.version,
        "selected": len(record.selected),
        "updates": len(record.contributed),
        "dropped": list(record.dropped),
        "failed": list(record.failed),
        "refused": record.refused or None,
        "elapsed_s": round(record.elapsed_s, 3),
        "accuracy": number(metrics.get("accuracy")),
        "federated_accuracy": (
            number(federated.get("accuracy")) if isinstance(federated, dict) else None
        ),
        "devices": (
            {str(k): v for k, v in devices.items() if number(v) is not None}
            if isinstance(devices, dict)
            else {}
        ),
        "epsilon": (
            number(privacy.get("epsilon_total")) if isinstance(privacy, dict) else None
        ),
    }
