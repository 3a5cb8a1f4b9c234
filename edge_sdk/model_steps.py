"""Device steps of training rounds: model download, local training, update upload.

The coordinator's side is ``coordinator/training.py``. On the device:

* **download**: a global version arrives as a chunked transfer whose purpose
  is ``"<model>.v<version>"`` and whose id is derived from (federation,
  model, version) (`ursa.protocol.ids.model_transfer_id`, as on the
  coordinator). Chunks
  of a newer version of this device's model are reassembled (capped at
  ``max_model_bytes``), checked by sha256 and by the trainer (array names
  and shapes); the latest complete version is kept in memory. A version the
  device needs but lacks chunks of is re-requested (`ChunkRequest`, chunk 0
  when the manifest is unknown) by `poll`, at most every ``retry_s``.
* **training**: a device selected in round r (signed `SelectionResult`) trains
  once the retained `ModelAvailable` of round r has arrived, its version is
  downloaded, and every method is ready (CLIMB: the round's dual step has
  given it ``w_i``, `ursa.edge_sdk.methods.climb`). It calls
  `ModelTrainer.train_delta` from that version with the methods' `TrainPlan`
  (``delta_scale = w_i``) and sends `ModelUpdate`: the delta
  inline when it fits ``inline_limit`` (float32 or float16 per
  ``trainer.wire_dtype``), else a manifest + chunks (purpose
  ``model_update``) followed by the update naming the transfer; the
  coordinator's chunk re-requests are answered from the cached upload.
* **idempotence**: update message ids derive from (device, round); a
  re-published `ModelAvailable` of a round already trained re-sends the same
  messages (the coordinator drops ids it has seen), never retrains.

Training runs on the client's delivery thread (a device trains one round at
a time); keepalives continue on the transport's network thread.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk.callbacks import RoundTrained
from ursa.edge_sdk.data_check import (
    DataFacts,
    DataProblem,
    FederationFacts,
    data_problems,
)
from ursa.edge_sdk.device_core import TrainingStats
from ursa.edge_sdk.method import DeviceMethod, TrainPlan
from ursa.edge_sdk.round_steps import RoundSteps
from ursa.edge_sdk.secure_aggregation.participant import SecAggError
from ursa.edge_sdk.secure_aggregation.rounds import Contribution, MaskingRounds
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.weights import Arrays, WeightsError, arrays_from_bytes, arrays_to_bytes
from ursa.protocol.chunking import Reassembler, split
from ursa.protocol.errors import ProtocolError
from ursa.protocol.ids import derived_id, model_transfer_id
from ursa.protocol.messages import (
    DEFAULT_CHUNK_SIZE,
    MAX_UPDATE_METRICS,
    NAME_PATTERN,
    BaseMessage,
    Chunk,
    ChunkRequest,
    ErrorCode,
    ErrorReply,
    MaskedUpdate,
    ModelAvailable,
    ModelUpdate,
    SecAggRoster,
    SecAggSetup,
    SecAggShareBundle,
    SecAggUnmask,
    TransferManifest,
)
from ursa.protocol.router import NotReadyError
from ursa.protocol.secure_aggregation import float_names

__all__ = ["ModelSteps"]

logger = logging.getLogger("ursa.edge_sdk")

UPDATE_PURPOSE = "model_update"
DEFAULT_MAX_MODEL_BYTES = 64 * 1024 * 1024
DEFAULT_RETRY_S = 2.0
KEPT_UPLOADS = 4
_METRIC_NAME = re.compile(NAME_PATTERN)
_PURPOSE_RE = re.compile(r"^(?P<model>[a-z][a-z0-9_.-]*)\.v(?P<version>\d+)$")


@dataclass
class _Wanted:
    version: int
    transfer_id: str
    asked_at: float


class ModelSteps(RoundSteps):
    """Model download, local training and upload (see the module docstring)."""

    inline_limit: int = DEFAULT_CHUNK_SIZE
    """Deltas up to this many bytes go inline in `ModelUpdate`."""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    retry_s: float = DEFAULT_RETRY_S
    max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES

    training_stats: TrainingStats
    _methods: list[DeviceMethod]
    _model_notice: ModelAvailable | None
    _notice_at: float
    _model_version: int | None
    _model_arrays: Arrays | None
    _model_sha256: str | None
    _model_parts: Reassembler
    _model_inflight: dict[str, int]
    _wanted: _Wanted | None
    _unfit_version: int | None
    _pending_rounds: set[int]
    _sent_updates: OrderedDict[int, list[BaseMessage]]
    _uploads: OrderedDict[str, tuple[TransferManifest, list[Chunk]]]
    _masking: MaskingRounds | None
    _model_listeners: list[Callable[[], None]]
    """Told after the methods when a new version is downloaded (the end's)."""

    def _init_model_steps(self) -> None:
        self.training_stats = TrainingStats()
        self._model_notice = None
        self._notice_at = 0.0
        self._model_version = None
        self._model_arrays = None
        self._model_sha256 = None
        self._model_parts = Reassembler(
            max_transfer_bytes=self.max_model_bytes,
            max_total_bytes=2 * self.max_model_bytes,
        )
        self._model_inflight = {}
        self._wanted = None
        self._unfit_version = None
        self._pending_rounds = set()
        self._sent_updates = OrderedDict()
        self._uploads = OrderedDict()
        self._masking = None

    @property
    def model_version(self) -> int | None:
        """The latest global model version downloaded."""
        return self._model_version

    @property
    def model_arrays(self) -> Arrays | None:
        """The latest global model downloaded (e.g. to serve inference)."""
        return self._model_arrays

    def _masking_rounds(self) -> MaskingRounds:
        """The device's secure-aggregation rounds (made once the identity is loaded)."""
        if self._masking is None:
            self._masking = MaskingRounds(
                identity=self._identity,
                federation=self._config.federation,
                send=self._send,
                verify_coordinator=self._verify_coordinator,
                message_id=lambda step, r: derived_id(self.device_id, step, r),
                peer_identity=self._trusted,
            )  # its own randomness: rounding and DP noise no seed can predict
        return self._masking

    def _verify_coordinator(self, message: BaseMessage) -> None:
        """The pinned coordinator's signature on ``message`` (parked until pinned)."""
        coordinator = self._coordinator
        if coordinator is None:
            raise NotReadyError
        self._verify(coordinator, message)

    def _secure_epoch(self) -> bool:
        """Whether the adopted key epoch sums updates under masks."""
        epoch = self._epoch
        return epoch is None or epoch.aggregation == "secure"

    # --- secure aggregation ---------------------------------------------------

    def _on_secagg_setup(self, message: SecAggSetup) -> None:
        if self.model_trainer() is not None:
            self._masking_rounds().on_setup(message)

    def _on_secagg_roster(self, message: SecAggRoster) -> None:
        if self._masking is not None:
            self._masking.on_roster(message)

    def _on_secagg_bundle(self, message: SecAggShareBundle) -> None:
        if self._masking is not None and self._masking.on_bundle(message):
            self._maybe_train()

    def _on_secagg_unmask(self, message: SecAggUnmask) -> None:
        if self._masking is not None:
            self._masking.on_unmask(message)

    def model_trainer(self) -> ModelTrainer | None:
        """The trainer, if it trains a model (else the device only selects)."""
        trainer = self._trainer
        return trainer if isinstance(trainer, ModelTrainer) else None

    # --- the methods' hooks ---------------------------------------------------

    def _on_model_ready(self) -> None:
        """A new global version has been downloaded: tell the methods, train."""
        for method in self._methods:
            method.on_model_ready()
        self._maybe_train()
        for listener in self._model_listeners:
            listener()

    # --- selection -> training ------------------------------------------------

    def _on_selected(self, round_index: int, selection_id: str) -> None:
        if self.model_trainer() is None:
            super()._on_selected(round_index, selection_id)
            return
        logger.info("%s: selected in round %d", self.device_id, round_index)
        self._pending_rounds.add(round_index)
        self._maybe_train()

    def _on_model_available(self, message: ModelAvailable) -> None:
        for method in self._methods:
            method.admit_model(message)  # NotReadyError: held back, retried later
        trainer = self.model_trainer()
        if trainer is None or message.model != trainer.model:
            return
        notice = self._model_notice
        if notice is not None and message.round < notice.round:
            return
        if notice is None or message.round > notice.round:
            self._model_notice = message
            self._notice_at = time.monotonic()
        sent = self._sent_updates.get(message.round)
        if sent is not None:  # the coordinator re-published: answer the same
            for item in sent:
                self._send(item)
            return
        self.want(message.model_version, message.transfer_id)
        self._maybe_train()

    def _maybe_train(self) -> None:
        trainer = self.model_trainer()
        notice = self._model_notice
        if trainer is None or notice is None:
            return
        for round_index in sorted(self._pending_rounds):
            if notice.round < round_index:
                continue
            if notice.round > round_index:
                logger.warning(
                    "%s: round %d is over before it could train",
                    self.device_id,
                    round_index,
                )
                self._pending_rounds.discard(round_index)
                continue
            if self._model_version != notice.model_version:
                self.want(notice.model_version, notice.transfer_id)
                continue
            if self._model_sha256 != notice.sha256:
                self._pending_rounds.discard(round_index)
                self._sent_updates[notice.round] = [self._digest_refused(notice)]
                continue
            if not all(m.ready_to_train(round_index) for m in self._methods):
                continue
            if self._secure_epoch() and not self._masking_rounds().ready(
                round_index, trainer.model, notice.model_version
            ):
                continue  # its shares have not arrived (or it is not in the sum)
            self._pending_rounds.discard(round_index)
            self._train_round(trainer, notice)

    def _train_round(self, trainer: ModelTrainer, notice: ModelAvailable) -> None:
        arrays = self._model_arrays
        assert arrays is not None
        plan = TrainPlan(notice.round)
        started = time.perf_counter()
        try:
            for method in self._methods:
                plan = method.plan(plan)
            result = trainer.train_planned(
                notice.round,
                arrays,
                delta_scale=plan.delta_scale,
                proximal_mu=plan.proximal_mu,
            )
        except Exception as exc:  # the app's code: whatever it raises is reported
            reply = self._report_failure(
                ErrorCode.TRAINING_FAILED, notice.round, exc, notice.message_id
            )
            self._sent_updates[notice.round] = [reply]
            return
        train_s = time.perf_counter() - started
        self.training_stats.train_s += train_s
        fed, me = self._config.federation, self.device_id
        secure = self._secure_epoch()
        if not secure and not self._config.allow_plain_aggregation:
            reply = self._plain_refused(notice)
            self._sent_updates[notice.round] = [reply]
            return
        if secure:
            contribution = Contribution(
                result.delta,
                result.num_examples,
                loss=dict(update_metrics(result, train_s)).get("loss", 0.0),
                train_s=train_s,
                names=float_names(arrays),
            )
            try:
                payload = self._masking_rounds().masked_vector(
                    notice.round, contribution
                )
            except SecAggError as exc:
                reply = self._report_failure(
                    ErrorCode.SECURE_AGGREGATION_FAILED,
                    notice.round,
                    exc,
                    notice.message_id,
                )
                self._sent_updates[notice.round] = [reply]
                return
        else:
            payload = arrays_to_bytes(result.delta, dtype=trainer.wire_dtype)
        messages: list[BaseMessage] = []
        inline = len(payload) <= self.inline_limit
        transfer_id = None
        if not inline:
            transfer_id = derived_id(me, "upload", notice.round, notice.model_version)
            manifest, chunks = split(
                payload,
                purpose=UPDATE_PURPOSE,
                federation=fed,
                round=notice.round,
                sender=me,
                chunk_size=self.chunk_size,
                transfer_id=transfer_id,
            )
            self._uploads[transfer_id] = (manifest, chunks)
            while len(self._uploads) > KEPT_UPLOADS:
                self._uploads.popitem(last=False)
            messages += [manifest, *chunks]
        update: BaseMessage
        if secure:
            update = MaskedUpdate(
                federation=fed,
                round=notice.round,
                sender=me,
                message_id=derived_id(me, "update", notice.round),
                model=trainer.model,
                base_version=notice.model_version,
                transfer_id=transfer_id,
                vector=payload if inline else None,
            )
        else:
            update = ModelUpdate(
                federation=fed,
                round=notice.round,
                sender=me,
                message_id=derived_id(me, "update", notice.round),
                model=trainer.model,
                base_version=notice.model_version,
                num_examples=result.num_examples,
                delta_scaled=plan.scaled,
                transfer_id=transfer_id,
                weights=payload if inline else None,
                metrics=update_metrics(result, train_s),
            )
        messages.append(update)
        self._sent_updates[notice.round] = messages
        while len(self._sent_updates) > KEPT_UPLOADS:
            self._sent_updates.popitem(last=False)
        for item in messages:
            self._send(item)
        self.training_stats.rounds_trained += 1
        self.training_stats.update_bytes += len(payload)
        self._notify_trained(
            RoundTrained(
                notice.round,
                notice.model_version,
                result.num_examples,
                train_s,
                len(payload),
            )
        )
        logger.info(
            "%s: round %d trained from version %d (%d examples, w=%.3f, %d bytes)",
            me,
            notice.round,
            notice.model_version,
            result.num_examples,
            plan.delta_scale,
            len(payload),
        )

    def _digest_refused(self, notice: ModelAvailable) -> ErrorReply:
        """The held bytes of the round's version are not the signed notice's: say so.

        The chunks matched their manifest, so only a coordinator whose notice
        and manifest disagree gets here; the device trains nothing that round.
        """
        held = self._model_sha256 or ""
        logger.error(
            "%s: round %d: model version %d's bytes (sha256 %s...) are not the "
            "ones the signed model notice names (%s...); not training from them",
            self.device_id,
            notice.round,
            notice.model_version,
            held[:12],
            notice.sha256[:12],
        )
        reason = (
            f"model version {notice.model_version} does not match the notice's sha256"
        )
        return self._round_refused(notice, ErrorCode.TRANSFER_FAILED, reason)

    def _plain_refused(self, notice: ModelAvailable) -> ErrorReply:
        """The epoch sums in the clear and this device does not allow it: say so."""
        logger.error(
            "%s: round %d: the coordinator sums plain updates ([aggregation] mode "
            '= "plain"); this device sends none (allow_plain_aggregation = false)',
            self.device_id,
            notice.round,
        )
        reason = "this device sends no plain model update"
        return self._round_refused(notice, ErrorCode.PLAIN_REFUSED, reason)

    def _round_refused(
        self, notice: ModelAvailable, code: ErrorCode, reason: str
    ) -> ErrorReply:
        """Tell the coordinator this device sends no update in the notice's round."""
        reply = ErrorReply(
            federation=self._config.federation,
            round=notice.round,
            sender=self.device_id,
            message_id=derived_id(self.device_id, code.value, notice.round),
            code=code,
            reason=reason,
            in_reply_to=notice.message_id,
        )
        self._send(reply)
        return reply

    # --- download -------------------------------------------------------------

    def _forget_downloads(self) -> None:
        """Drop every downloaded or in-flight version and the current notice.

        For a device whose trainer switches to another model (FedDisk's
        phase 2), whose versions restart at 0.
        """
        for transfer_id in self._model_inflight:
            self._model_parts.discard(transfer_id)
        self._model_inflight.clear()
        self._model_version = self._model_arrays = self._model_notice = None
        self._model_sha256 = None
        self._notice_at = 0.0
        self._wanted = None
        self._unfit_version = None
        self._model_problems = ()
        self._sent_updates.clear()

    def want(self, version: int, transfer_id: str) -> None:
        """Make sure ``version`` is downloaded (or on its way)."""
        if self._model_version is not None and self._model_version >= version:
            return
        if self._unfit_version is not None and version <= self._unfit_version:
            return  # it does not fit this device: downloading it again is no use
        wanted = self._wanted
        if wanted is None or wanted.version < version:
            self._wanted = _Wanted(version, transfer_id, time.monotonic())

    def _model_arrays_at(self, version: int) -> Arrays | None:
        if self._model_version == version:
            return self._model_arrays
        trainer = self.model_trainer()
        if trainer is not None:
            fed = self._config.federation
            self.want(version, model_transfer_id(fed, trainer.model, version))
        return None

    def _on_transfer_manifest(self, message: TransferManifest) -> None:
        trainer = self.model_trainer()
        match = _PURPOSE_RE.match(message.purpose)
        if trainer is None or match is None or match.group("model") != trainer.model:
            return
        version = int(match.group("version"))
        if self._model_version is not None and version <= self._model_version:
            return
        if self._unfit_version is not None and version <= self._unfit_version:
            return
        for tid, known in list(self._model_inflight.items()):
            if known < version:
                self._model_parts.discard(tid)
                del self._model_inflight[tid]
        try:
            self._model_parts.add_manifest(message)
        except ProtocolError as exc:
            logger.warning("%s: model manifest refused: %s", self.device_id, exc)
            return
        self._model_inflight[message.transfer_id] = version
        self._try_complete(message.transfer_id)

    def _on_chunk(self, message: Chunk) -> None:
        tid = message.transfer_id
        if tid not in self._model_inflight:
            return
        try:
            self._model_parts.add_chunk(message)
        except ProtocolError as exc:
            logger.warning("%s: model chunk refused: %s", self.device_id, exc)
            return
        self._try_complete(tid)

    def _try_complete(self, transfer_id: str) -> None:
        version = self._model_inflight[transfer_id]
        try:
            if not self._model_parts.is_complete(transfer_id):
                return
            payload = self._model_parts.complete(transfer_id)
            # a later version has the architecture of the one this device holds
            arrays = arrays_from_bytes(payload, self._model_arrays)
        except (ProtocolError, WeightsError, ValueError) as exc:
            logger.warning(
                "%s: model version %d refused: %s", self.device_id, version, exc
            )
            return
        del self._model_inflight[transfer_id]
        trainer = self.model_trainer()
        if trainer is not None:
            problems = _model_problems(trainer, arrays, self._labels, version)
            if problems:
                self._refuse_model(version, problems)
                return
            self._model_problems = ()
        if self._model_version is not None and version <= self._model_version:
            return
        self._model_version, self._model_arrays = version, arrays
        self._model_sha256 = hashlib.sha256(payload).hexdigest()
        self.training_stats.models_downloaded += 1
        if self._wanted is not None and self._wanted.version <= version:
            self._wanted = None
        logger.debug("%s: model version %d downloaded", self.device_id, version)
        self._notify_model(version)
        self._on_model_ready()

    def _refuse_model(self, version: int, problems: tuple[DataProblem, ...]) -> None:
        """A global model this device cannot train: stop asking, sit the epoch out."""
        changed = problems != self._model_problems
        self._model_problems = problems
        self._unfit_version = max(version, self._unfit_version or 0)
        if self._wanted is not None and self._wanted.version <= version:
            self._wanted = None
        self._pending_rounds.clear()
        epoch, notice = self._epoch, self._model_notice
        if epoch is not None and not self.sits_out:
            round_index = 0 if notice is None else notice.round
            in_reply_to = None if notice is None else notice.message_id
            self._sit_out(epoch.epoch, round_index, problems, in_reply_to)
        elif changed and epoch is None:
            logger.error(
                "%s: model version %d does not fit: %s",
                self.device_id,
                version,
                "; ".join(str(p) for p in problems),
            )
        else:
            logger.info(
                "%s: model version %d does not fit either", self.device_id, version
            )

    def _on_chunk_request(self, message: ChunkRequest) -> None:
        upload = self._uploads.get(message.transfer_id)
        if upload is None:
            logger.info("%s: chunk request for an unknown upload", self.device_id)
            return
        manifest, chunks = upload
        self._send(manifest)
        by_index = {c.index: c for c in chunks}
        for index in message.indices:
            chunk = by_index.get(index)
            if chunk is not None:
                self._send(chunk)

    def _request_model(self, now: float) -> None:
        """Ask for the missing chunks of the wanted version (every retry_s)."""
        wanted = self._wanted
        if wanted is None or now - wanted.asked_at < self.retry_s:
            return
        wanted.asked_at = now
        tid = wanted.transfer_id
        try:
            missing = self._model_parts.missing(tid)
        except ProtocolError:
            missing = (0,)  # no manifest yet: the answer brings it
        if not missing:
            return
        notice = self._model_notice
        self._send(
            ChunkRequest(
                federation=self._config.federation,
                round=0 if notice is None else notice.round,
                sender=self.device_id,
                transfer_id=tid,
                indices=missing,
            )
        )

    def _poll_training(self, now: float) -> None:
        """Periodic work: re-request model chunks, re-check waiting rounds."""
        self._request_model(now)
        self._maybe_train()


def _model_problems(
    trainer: ModelTrainer,
    arrays: Arrays,
    labels: NDArray[np.int64],
    version: int,
) -> tuple[DataProblem, ...]:
    """How a downloaded global model does not fit this device (its data, its model)."""
    model = f"model {trainer.model} v{version}"
    federation = FederationFacts(
        model_features=trainer.model_features(arrays), model=model
    )
    facts = DataFacts.of(labels, trainer.features)
    problems = tuple(data_problems(facts, federation))
    if problems:
        return problems
    try:
        trainer.check_arrays(arrays)
    except ValueError as exc:
        return (
            DataProblem(
                f"the federation's {model} does not fit this device's model: {exc}",
                "give the device the federation's model ([training] "
                "architecture and model_options, or the app's module)",
                model=True,
            ),
        )
    return ()


def update_metrics(result: LocalDelta, train_s: float) -> tuple[tuple[str, float], ...]:
    """What a `ModelUpdate` says of the training, at most 16 metrics.

    ``samples``, ``train_s`` and the trainer's finite metrics (its
    ``mean_train_loss`` as ``loss``).
    """
    said: dict[str, float] = {
        "samples": float(result.num_examples),
        "train_s": float(train_s),
    }
    for name, value in result.metrics.items():
        key = "loss" if name == "mean_train_loss" else name
        if key not in said and _METRIC_NAME.fullmatch(key) and math.isfinite(value):
            said[key] = float(value)
    return tuple(said.items())[:MAX_UPDATE_METRICS]
