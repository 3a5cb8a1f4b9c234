"""FedDisk on the coordinator: MADE rounds with a blind stop rule, then the classifier.

Phase 1 trains the global MADE by ordinary FedAvg rounds (the ``made``
`TrainingPlugin`) until the fleet's validation NLL rises; phase 2 trains the
classifier (the ``classifier`` `TrainingPlugin`) with per-sample weights the
devices compute from the MADEs. Round r, after the signed selection::

    phase made, MADE version v = 0 or already judged:
        a MADE training round (`ursa.coordinator.training`), counted
    phase made, v > 0 not yet judged (the loss step, `steps`):
        1  TransferManifest("made.v<v>") + Chunks -> all
        2  MeanRequest(feddisk.made_loss, r, epoch, made, v) -> all;
           MeanReport(Enc([nll*n, n])) from every registered online device
           -> encrypted running sum
        3  [all reported, or loss_timeout_s] MeanSum -> all (nobody
           reported: no sum, train on); devices decrypt the fleet's mean NLL
        4  the epoch's agent -> MadeVerdict(epoch, v, stop, best), signed
           [or verdict_timeout_s: train on]
        5  stop, or max_made_rounds MADE rounds trained -> SWITCH:
           FeddiskSwitch(made, best, classifier) -> all (retained; devices
           kept the best MADE's weights themselves), then round r is the
           first classifier round; else round r is another MADE round
    phase classifier: a classifier training round

What the coordinator learns: ciphertexts, one stop bit per MADE round and
the best version. It never holds an epoch secret key, so it sees no loss and
no split size. A loss report or verdict is refused with an `ErrorReply`
(another epoch or version, an unregistered device, a garbled ciphertext, a
verdict not from the epoch's agent or not signed by it, a verdict before the
sum). Progress (phase, counts, best version) is FedDisk's ``method_state``
and the open loss step and verdict wait are phase records, all in the
coordinator's store (`ursa.coordinator.methods.feddisk.state`,
`ursa.coordinator.methods.feddisk.judging`), written in the transaction of the
message that changed them: a restarted coordinator calling `on_selected`
again for the same round resumes where it was, with fresh loss and verdict
deadlines (a re-sent `FeddiskSwitch` is harmless: devices are idempotent).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, Literal

from ursa.coordinator.clock import Clock
from ursa.coordinator.federation_end import FinalModel
from ursa.coordinator.methods.feddisk.judging import FeddiskJudging
from ursa.coordinator.methods.feddisk.state import FeddiskRoundKind, FeddiskState
from ursa.coordinator.methods_config import FeddiskSpec
from ursa.coordinator.plugin import (
    CoordinatorView,
    RoundInfo,
    RoundOutcome,
    Send,
)
from ursa.coordinator.training import TrainingPlugin
from ursa.protocol.messages import (
    COORDINATOR,
    MADE_LOSS,
    BaseMessage,
    ChunkRequest,
    FeddiskSwitch,
    MadeVerdict,
    MeanReport,
    ModelSpec,
)
from ursa.protocol.router import RejectedError

__all__ = ["FeddiskPlugin"]

logger = logging.getLogger("ursa.coordinator.feddisk")

Phase = Literal["made", "classifier"]


class FeddiskPlugin(FeddiskJudging):
    """FedDisk rounds: MADE training judged blind, then classifier training.

    Args:
        view: The service's view (the store holds FedDisk's progress).
        federation: The federation id (messages carry it).
        made: The global MADE's training rounds (FedAvg weighting, no
            before-training steps).
        classifier: The classifier's training rounds (phase 2; the runtime's
            steps run before them).
        config: FedDisk's phase-1 settings.
        clock: Seconds, for the loss and verdict deadlines.
        on_switch: Called with (round, best MADE version) after the switch.

    Raises:
        ValueError: ``made`` does not train ``config.made_model``, or both
            plugins train the same model.
    """

    def __init__(
        self,
        view: CoordinatorView,
        *,
        federation: str,
        made: TrainingPlugin,
        classifier: TrainingPlugin,
        config: FeddiskSpec | None = None,
        clock: Clock = time.time,
        on_switch: Callable[[int, int], None] | None = None,
    ) -> None:
        self.config = config or FeddiskSpec()
        if made.config.model != self.config.made_model:
            raise ValueError(
                f"the MADE plugin trains {made.config.model!r}, FedDisk expects "
                f"{self.config.made_model!r}"
            )
        if classifier.config.model == made.config.model:
            raise ValueError(f"MADE and classifier are both {made.config.model!r}")
        self._federation = federation
        self._made = made
        self._classifier = classifier
        self._clock = clock
        self._on_switch = on_switch
        self._view = view
        self._head = None
        self._agent = ""
        self._loss = None
        self._verdict = None
        self._selected: tuple[str, ...] = ()
        self._announced = False

    # --- public view ------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        """``"made"`` (phase 1) or ``"classifier"`` (phase 2)."""
        return "classifier" if self._state.switch_round is not None else "made"

    @property
    def made_rounds(self) -> int:
        """MADE training rounds run so far."""
        return self._state.made_rounds

    @property
    def best_version(self) -> int | None:
        """The best MADE version (the agent's last word), None before any verdict."""
        return self._state.best_version

    @property
    def switch_round(self) -> int | None:
        """The first classifier round, None in phase 1."""
        return self._state.switch_round

    @property
    def made(self) -> TrainingPlugin:
        """The global MADE's training rounds."""
        return self._made

    @property
    def classifier(self) -> TrainingPlugin:
        """The classifier's training rounds."""
        return self._classifier

    # --- RoundPlugin ------------------------------------------------------------

    @cached_property
    def _state(self) -> FeddiskState:
        """FedDisk's saved progress, read once from the store (open by then).

        Raises:
            FeddiskStateError: the saved progress is corrupt.
        """
        return FeddiskState.load(self._view.store)

    def on_selected(
        self, round_index: int, selected: tuple[str, ...], send: Send
    ) -> None:
        """Judge the latest MADE version if due, else train the phase's model."""
        self._selected = selected
        state = self._state
        if self.phase == "classifier":
            if not self._announced:
                self._announce_switch(round_index, send)
            self._classifier.on_selected(round_index, selected, send)
            return
        if state.round == round_index and state.role is FeddiskRoundKind.MADE:
            self._made.on_selected(round_index, selected, send)  # a restart
            return
        version = self._made.version
        if version > 0 and version != state.judged_version:
            self._open_loss(round_index, version, send)
            return
        self._decide(round_index, None, send)

    def round_info(self, round_index: int) -> RoundInfo | None:
        """The classifier's round, while it waits on the runtime's steps.

        The steps are the classifier's (a federated evaluation scores it): a
        MADE round or a loss step runs none.
        """
        if self.phase != "classifier":
            return None
        return self._classifier.round_info(round_index)

    def on_steps_done(self, round_index: int, send: Send) -> None:
        """The active model's round trains (the MADE's waits on no steps)."""
        self._active().on_steps_done(round_index, send)

    def on_message(self, round_index: int, message: BaseMessage, send: Send) -> None:
        """Take loss reports and verdicts; route the rest to the active model."""
        if isinstance(message, MeanReport) and message.purpose == MADE_LOSS:
            self._on_loss(round_index, message, send)
        elif isinstance(message, MadeVerdict):
            self._on_verdict(round_index, message, send)
        elif isinstance(message, ChunkRequest):
            self._on_chunk_request(round_index, message, send)
        else:
            self._active().on_message(round_index, message, send)

    def on_tick(self, round_index: int, now: float, send: Send) -> None:
        """Close the loss step or the verdict wait at their deadlines, else delegate."""
        if not self._tick_loss(round_index, now, send):
            self._active().on_tick(round_index, now, send)

    def extend_deadlines(self, seconds: float) -> None:
        """The loss step, the verdict wait and the active model's round wait longer."""
        if self._loss is not None:
            self._loss.extend(seconds)
        if self._verdict is not None:
            self._verdict.extend(seconds)
        self._active().extend_deadlines(seconds)

    def last_metrics(self) -> Mapping[str, Any]:
        """The classifier's last evaluation (the MADE's is no accuracy)."""
        return self._classifier.last_metrics() if self.phase == "classifier" else {}

    def final_model(self, send: Send) -> FinalModel | None:
        """The classifier's final model (None if the MADE phase never ended)."""
        if self.phase != "classifier":
            return None
        return self._classifier.final_model(send)

    def round_outcome(self, round_index: int) -> RoundOutcome | None:
        """The outcome of the round as the MADE's or the classifier's plugin ran it."""
        return self._made.round_outcome(round_index) or self._classifier.round_outcome(
            round_index
        )

    def on_device_failed(self, round_index: int, device: str, code: str) -> None:
        """The active model's round stops waiting for a device whose training failed."""
        self._active().on_device_failed(round_index, device, code)

    def model_spec(self) -> ModelSpec | None:
        """The active phase's model's (a device checks a spec of its own model only)."""
        return self._active().model_spec()

    def aggregation_mode(self) -> Literal["secure", "plain"]:
        """The classifier's (both phases are built from one ``[aggregation]``)."""
        return self.classifier.aggregation_mode()

    def methods(self) -> tuple[str, ...]:
        """FedDisk: devices judge the MADE rounds and weight their samples."""
        return ("feddisk",)

    def is_complete(self, round_index: int) -> bool:
        """Whether the round's training (and its loss step) is done."""
        if self.phase == "classifier":
            return self._classifier.is_complete(round_index)
        current = self._state.round
        if current != round_index:
            return current is not None and current > round_index
        if self._state.role is FeddiskRoundKind.LOSS:
            return False
        return self._made.is_complete(round_index)

    # --- decisions ------------------------------------------------------------------

    def _decide(
        self, round_index: int, verdict: MadeVerdict | None, send: Send
    ) -> None:
        """After a judgement (or none): switch, or another MADE round."""
        state = self._state
        judged = self._end_judging()
        if judged is not None:
            state.judged_version = judged
        if verdict is not None:
            state.best_version = verdict.best_version
        capped = state.made_rounds >= self.config.max_made_rounds
        if (verdict is not None and verdict.stop) or capped:
            self._switch(round_index, "stop" if not capped else "round cap", send)
            return
        state.made_rounds += 1  # a round already training never comes here
        state.enter(round_index, FeddiskRoundKind.MADE)
        self._made.on_selected(round_index, self._selected, send)

    def _switch(self, round_index: int, why: str, send: Send) -> None:
        state = self._state
        if state.best_version is None:
            state.best_version = self._made.version
        state.switch_round = round_index
        state.enter(round_index, FeddiskRoundKind.CLASSIFIER)
        logger.info(
            "round %d: FedDisk switches to %s (%s after %d MADE rounds; best %s "
            "version %d)",
            round_index,
            self._classifier.config.model,
            why,
            state.made_rounds,
            self.config.made_model,
            state.best_version,
        )
        self._announce_switch(round_index, send)
        if self._on_switch is not None:
            try:
                self._on_switch(round_index, state.best_version)
            except Exception:
                logger.exception("round %d: on_switch callback failed", round_index)
        self._classifier.on_selected(round_index, self._selected, send)

    def _announce_switch(self, round_index: int, send: Send) -> None:
        best = self._state.best_version
        assert best is not None
        send(
            FeddiskSwitch(
                federation=self._federation,
                round=round_index,
                sender=COORDINATOR,
                made_model=self.config.made_model,
                made_version=best,
                model=self._classifier.config.model,
            ),
            None,
        )
        self._announced = True

    # --- MADE downloads -------------------------------------------------------------

    def _on_chunk_request(
        self, round_index: int, request: ChunkRequest, send: Send
    ) -> None:
        active = self._active()
        other = self._made if active is self._classifier else self._classifier
        try:
            active.on_message(round_index, request, send)
        except RejectedError as first:
            try:
                other.on_message(round_index, request, send)
            except RejectedError:
                raise first from None

    # --- helpers --------------------------------------------------------------------

    def _active(self) -> TrainingPlugin:
        return self._classifier if self.phase == "classifier" else self._made
