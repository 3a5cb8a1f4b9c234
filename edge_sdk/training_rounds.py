"""`TrainingRounds`: model download, local training, masking and update upload.

The coordinator's side is ``coordinator/training.py``. On the device:

* **download**: the global versions the device is sent or needs, by the
  `ModelDownloads` this part owns (``downloads.py``; transfer ids from
  `ursa.protocol.ids`): the coordinator pushes a round's version to the
  selected devices only (to all when every device reads it), so a device
  fetches a version only when it needs one it lacks (selected, a mean at
  that version, the final model); a complete version is checked here
  against the trainer (array names and shapes) and the data before it is
  kept, and `poll` asks for missing chunks.
* **training**: a device selected in round r (signed `SelectionResult`; a
  selection-only device runs `Trainer.train` at once) trains
  once the retained `ModelAvailable` of round r has arrived, its version is
  downloaded, and every method is ready (CLIMB: the round's dual step has
  given it ``w_i``, `ursa.edge_sdk.methods.climb`). It calls
  `ModelTrainer.train_delta` from that version with the methods' `TrainPlan`
  (``delta_scale = w_i``) and sends the delta (float32 or float16 per
  ``trainer.wire_dtype``) through `UpdateUploads` (``update_uploads.py``).
* **idempotence**: update message ids derive from (device, round); a
  re-published `ModelAvailable` of a round already trained re-sends the same
  messages (the coordinator drops ids it has seen), never retrains.

With secure aggregation the delta goes masked (`MaskingRounds`). Training
runs on the client's delivery thread (a device trains one round at
a time); keepalives continue on the transport's network thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from ursa.edge_sdk.callbacks import (
    DeviceCallbacks,
    DeviceError,
    ModelReceived,
    RoundTrained,
    Selected,
    notify,
)
from ursa.edge_sdk.data_check import DataProblem
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.downloads import ModelDownloads
from ursa.edge_sdk.epoch_view import CurrentEpoch
from ursa.edge_sdk.local_dataset import LocalDataset
from ursa.edge_sdk.method import DeviceMethod, TrainPlan
from ursa.edge_sdk.model_fit import model_problems
from ursa.edge_sdk.secure_aggregation.participant import SecAggError
from ursa.edge_sdk.secure_aggregation.rounds import Contribution, MaskingRounds
from ursa.edge_sdk.stats import DeviceStats, TrainingStats
from ursa.edge_sdk.trainer import ModelTrainer, TrainingReport
from ursa.edge_sdk.update_uploads import UpdateUploads, update_metrics
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    Chunk,
    ChunkRequest,
    ErrorCode,
    ErrorReply,
    ModelAvailable,
    SecAggRoster,
    SecAggSetup,
    SecAggShareBundle,
    SecAggUnmask,
    SelectionResult,
    TransferManifest,
)
from ursa.protocol.router import Router
from ursa.protocol.secure_aggregation import float_names

__all__ = ["TrainingRounds"]

logger = logging.getLogger("ursa.edge_sdk")


class TrainingRounds:
    """Model download, local training and upload (see the module docstring).

    Args:
        link: The device on the wire.
        view: The current key epoch (read-only).
        data: The labels and the trainer.
        methods: The device's methods (their training-round hooks).
        device_stats: Counts the rounds this device was selected in.
        callbacks: The app's hooks.
        sit_out: Sits the current key epoch out (a model that does not fit).
        model_ready: Told after the methods when a new version is downloaded
            (the end of the federation's).
    """

    def __init__(
        self,
        *,
        link: DeviceLink,
        view: CurrentEpoch,
        data: LocalDataset,
        methods: Iterable[DeviceMethod],
        device_stats: DeviceStats,
        callbacks: DeviceCallbacks | None,
        sit_out: Callable[[int, tuple[DataProblem, ...], str | None], None],
        model_ready: Callable[[], None],
    ) -> None:
        self._link = link
        self._view = view
        self._data = data
        self._methods = methods
        self._device_stats = device_stats
        self._callbacks = callbacks
        self._sit_out = sit_out
        self._model_ready = model_ready
        self.stats = TrainingStats()
        """Counters of the training side (for demos and benchmarks)."""
        self.downloads = ModelDownloads(
            link=link,
            trainer=data.trainer,
            stats=self.stats,
            fits=self._fits,
            ready=self._on_downloaded,
        )
        """The global versions downloaded (`ursa.edge_sdk.downloads`)."""
        self._model_problems: tuple[DataProblem, ...] = ()
        self._model_notice: ModelAvailable | None = None
        self._notice_at = 0.0
        self._pending_rounds: set[int] = set()
        self._selected: set[int] = set()
        self.uploads = UpdateUploads(link)
        """What this device answered each round (its updates, and their chunks)."""
        self._masking: MaskingRounds | None = None

    def new_run(self) -> None:
        """Forget the old run's model, transfers and rounds."""
        self.downloads.new_run()
        self._model_notice = None
        self._notice_at = 0.0
        self._pending_rounds = set()
        self._selected = set()
        self.uploads.new_run()
        self._masking = None

    def register(self, router: Router) -> None:
        """The kinds of a training round on the device's router."""
        router.register(SelectionResult, self.on_selection_result, owner="training")
        router.register(ModelAvailable, self.on_model_available, owner="training")
        router.register(TransferManifest, self.on_manifest, owner="training")
        router.register(Chunk, self.on_chunk, owner="training")
        router.register(ChunkRequest, self.uploads.on_chunk_request, owner="training")
        router.register(SecAggSetup, self.on_secagg_setup, owner="training")
        router.register(SecAggRoster, self.on_secagg_roster, owner="training")
        router.register(SecAggShareBundle, self.on_secagg_bundle, owner="training")
        router.register(SecAggUnmask, self.on_secagg_unmask, owner="training")

    @property
    def model_notice(self) -> ModelAvailable | None:
        """The latest round's `ModelAvailable` (None before any)."""
        return self._model_notice

    @property
    def model_problems(self) -> tuple[DataProblem, ...]:
        """How the latest global model did not fit (kept until one fits)."""
        return self._model_problems

    def seconds_since_notice(self) -> float:
        """Seconds since the current round's `ModelAvailable` arrived."""
        return time.monotonic() - self._notice_at

    def _masking_rounds(self) -> MaskingRounds:
        """The device's secure-aggregation rounds (made once the identity is loaded)."""
        if self._masking is None:
            self._masking = MaskingRounds(
                identity=self._link.identity,
                federation=self._link.federation,
                send=self._link.send,
                verify_coordinator=self._link.verify_coordinator,
                message_id=lambda step, r: derived_id(self._link.device_id, step, r),
                peer_identity=self._link.trusted,
            )  # its own randomness: rounding and DP noise no seed can predict
        return self._masking

    def _secure_epoch(self) -> bool:
        """Whether the adopted key epoch sums updates under masks."""
        epoch = self._view.notice
        return epoch is None or epoch.aggregation == "secure"

    # --- secure aggregation ---------------------------------------------------

    def on_secagg_setup(self, message: SecAggSetup) -> None:
        """A masked round starts: make the round's pairwise keys."""
        if self._data.model_trainer is not None:
            self._masking_rounds().on_setup(message)

    def on_secagg_roster(self, message: SecAggRoster) -> None:
        """Who is in the masked sum: seal the shares to them."""
        if self._masking is not None:
            self._masking.on_roster(message)

    def on_secagg_bundle(self, message: SecAggShareBundle) -> None:
        """The shares sealed to this device: the round may train."""
        if self._masking is not None and self._masking.on_bundle(message):
            self.maybe_train()

    def on_secagg_unmask(self, message: SecAggUnmask) -> None:
        """Reveal the shares of the dropped or surviving peers."""
        if self._masking is not None:
            self._masking.on_unmask(message)

    # --- the methods' hooks ---------------------------------------------------

    def _on_model_ready(self) -> None:
        """A new global version has been downloaded: tell the methods, train."""
        for method in self._methods:
            method.on_model_ready()
        self.maybe_train()
        self._model_ready()

    # --- selection -> training ------------------------------------------------

    def on_selection_result(self, message: SelectionResult) -> None:
        """A signed selection naming this device: train its round."""
        self._link.verify_coordinator(message)
        me = self._link.device_id
        if me not in message.selected or message.round in self._selected:
            return
        if self._view.sits_out:  # selected before the coordinator heard why
            logger.info("%s: selected in round %d, but sitting out", me, message.round)
            return
        self._selected.add(message.round)
        self._device_stats.selected_rounds.append(message.round)
        notify(self._callbacks, "on_selected", Selected(message.round), device=me)
        self._on_selected(message.round, message.message_id)

    def _train_selected(self, round_index: int, selection_id: str) -> None:
        """A selection-only device's round: `Trainer.train` once, no model."""
        started = time.perf_counter()
        try:
            report: TrainingReport = self._data.trainer.train(round_index)
        except Exception as exc:  # the app's code: whatever it raises is reported
            self._report_failure(
                ErrorCode.TRAINING_FAILED, round_index, exc, selection_id
            )
            return
        elapsed = time.perf_counter() - started
        self._notify_trained(
            RoundTrained(round_index, None, report.num_examples, elapsed, 0)
        )
        logger.info(
            "%s: selected in round %d; trained on %d examples",
            self._link.device_id,
            round_index,
            report.num_examples,
        )

    def _on_selected(self, round_index: int, selection_id: str) -> None:
        if self._data.model_trainer is None:
            self._train_selected(round_index, selection_id)
            return
        logger.info("%s: selected in round %d", self._link.device_id, round_index)
        self._pending_rounds.add(round_index)
        self.maybe_train()

    def on_model_available(self, message: ModelAvailable) -> None:
        """A round's global model: train from it once it is here, if selected.

        Only a device selected in the round fetches a version it was not
        sent (`maybe_train`); the others keep what they hold until they need
        a version (an evaluation, the final model).
        """
        for method in self._methods:
            method.admit_model(message)  # NotReadyError: held back, retried later
        trainer = self._data.model_trainer
        if trainer is None or message.model != trainer.model:
            return
        notice = self._model_notice
        if notice is not None and message.round < notice.round:
            return
        if notice is None or message.round > notice.round:
            self._model_notice = message
            self._notice_at = time.monotonic()
        sent = self.uploads.answer_of(message.round)
        if sent is not None:  # the coordinator re-published: answer the same
            for item in sent:
                self._link.send(item)
            return
        self.maybe_train()  # a selected device fetches the version if it lacks it

    def maybe_train(self) -> None:
        """Train every selected round whose model, masks and methods are ready."""
        trainer = self._data.model_trainer
        notice = self._model_notice
        if trainer is None or notice is None:
            return
        for round_index in sorted(self._pending_rounds):
            if notice.round < round_index:
                continue
            if notice.round > round_index:
                logger.info(  # a race: back (or ready) after the round closed
                    "%s: round %d is over before it could train",
                    self._link.device_id,
                    round_index,
                )
                self._pending_rounds.discard(round_index)
                continue
            if self.downloads.model_version != notice.model_version:
                self.downloads.want(notice.model_version, notice.transfer_id)
                continue
            if self.downloads.model_sha256 != notice.sha256:
                self._pending_rounds.discard(round_index)
                self.uploads.keep(notice.round, [self._digest_refused(notice)])
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
        arrays = self.downloads.model_arrays
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
            self.uploads.keep(notice.round, [reply])
            return
        train_s = time.perf_counter() - started
        self.stats.train_s += train_s
        me = self._link.device_id
        secure = self._secure_epoch()
        if not secure and not self._link.config.allow_plain_aggregation:
            reply = self._plain_refused(notice)
            self.uploads.keep(notice.round, [reply])
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
                self.uploads.keep(notice.round, [reply])
                return
        else:
            payload = arrays_to_bytes(result.delta, dtype=trainer.wire_dtype)
        self.uploads.upload(
            notice,
            payload,
            secure=secure,
            num_examples=result.num_examples,
            scaled=plan.scaled,
            metrics=update_metrics(result, train_s),
        )
        self.stats.rounds_trained += 1
        self.stats.update_bytes += len(payload)
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
        held = self.downloads.model_sha256 or ""
        logger.error(
            "%s: round %d: model version %d's bytes (sha256 %s...) are not the "
            "ones the signed model notice names (%s...); not training from them",
            self._link.device_id,
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
            self._link.device_id,
            notice.round,
        )
        reason = "this device sends no plain model update"
        return self._round_refused(notice, ErrorCode.PLAIN_REFUSED, reason)

    def _round_refused(
        self, notice: ModelAvailable, code: ErrorCode, reason: str
    ) -> ErrorReply:
        """Tell the coordinator this device sends no update in the notice's round."""
        return self._link.tell_coordinator(
            code,
            reason,
            round_index=notice.round,
            message_id=derived_id(self._link.device_id, code.value, notice.round),
            in_reply_to=notice.message_id,
        )

    def _notify_trained(self, event: RoundTrained) -> None:
        device = self._link.device_id
        notify(self._callbacks, "on_round_trained", event, device=device)

    def _report_failure(
        self,
        code: ErrorCode,
        round_index: int,
        exc: Exception,
        in_reply_to: str | None,
    ) -> ErrorReply:
        """The app's trainer raised: log it here, tell the coordinator why in a word.

        The reply names the exception type only: its message and traceback
        may hold the device's data, so they stay in the device's own log.
        Returns the reply (to answer a re-published notice the same way).
        """
        me = self._link.device_id
        logger.error(
            "%s: %s in round %d: %s: %s",
            me,
            code.value,
            round_index,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        reason = f"{type(exc).__name__} raised by the device's trainer"
        reply = self._link.tell_coordinator(
            code,
            reason,
            round_index=round_index,
            message_id=derived_id(me, code.value, round_index),
            in_reply_to=in_reply_to,
        )
        event = DeviceError(round_index, code.value, reason, "device")
        notify(self._callbacks, "on_error", event, device=me)
        return reply

    # --- download -------------------------------------------------------------

    def forget_downloads(self) -> None:
        """Drop every downloaded or in-flight version and the current notice.

        For a device whose trainer switches to another model (FedDisk's
        phase 2), whose versions restart at 0.
        """
        self.downloads.forget()
        self._model_notice = None
        self._notice_at = 0.0
        self._model_problems = ()
        self.uploads.forget_answers()

    def _fits(self, version: int, arrays: Arrays) -> bool:
        """Whether a downloaded version fits the data and model (else refused)."""
        trainer = self._data.model_trainer
        if trainer is not None:
            model = f"model {trainer.model} v{version}"
            problems = model_problems(trainer, arrays, self._data.labels, model)
            if problems:
                self._refuse_model(version, problems)
                return False
            self._model_problems = ()
        return True

    def _on_downloaded(self, version: int) -> None:
        event = ModelReceived(version)
        notify(self._callbacks, "on_model", event, device=self._link.device_id)
        self._on_model_ready()

    def _refuse_model(self, version: int, problems: tuple[DataProblem, ...]) -> None:
        """A global model this device cannot train: stop asking, sit the epoch out."""
        changed = problems != self._model_problems
        self._model_problems = problems
        self.downloads.refuse(version)
        self._pending_rounds.clear()
        epoch, notice = self._view.notice, self._model_notice
        if epoch is not None and not self._view.sits_out:
            round_index = 0 if notice is None else notice.round
            in_reply_to = None if notice is None else notice.message_id
            self._sit_out(round_index, problems, in_reply_to)
        elif changed and epoch is None:
            logger.error(
                "%s: model version %d does not fit: %s",
                self._link.device_id,
                version,
                "; ".join(str(p) for p in problems),
            )
        else:
            logger.info(
                "%s: model version %d does not fit either",
                self._link.device_id,
                version,
            )

    def on_manifest(self, message: TransferManifest) -> None:
        """A transfer's manifest: a method's, else perhaps a model version's."""
        if not any(method.take_transfer(message) for method in self._methods):
            self.downloads.on_manifest(message)

    def on_chunk(self, message: Chunk) -> None:
        """A transfer's chunk: a method's, else perhaps a model version's."""
        if not any(method.take_transfer(message) for method in self._methods):
            self.downloads.on_chunk(message)

    def poll(self, now: float) -> None:
        """Periodic work: re-request model chunks, re-check waiting rounds."""
        notice = self._model_notice
        self.downloads.request(now, 0 if notice is None else notice.round)
        self.maybe_train()
