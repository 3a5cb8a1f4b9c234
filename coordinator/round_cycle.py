"""The round cycle: open a round, let the selection method choose, train, repeat.

SELECTING: the runtime publishes the round's retained `RoundAnnounce`, then
asks the federation's `SelectionMethod` at every step (every tick and after
every admitted message) until it names the round's K participants (a step
costs O(1) in the fleet's size: the eligible devices are kept per event,
`ursa.coordinator.epoch_work.EpochSets`); the
method's own steps and windows (Dubhe's volunteers, distributions and agent)
are its business (`ursa.coordinator.methods`). The runtime checks the
answer (K distinct eligible devices), signs the `SelectionResult`, stores
it with the round and publishes it; when the method says the selection is
private (Dubhe's stratified draw), each selected device instead gets its own
signed `SelectionResult` naming only itself, on its down topic.

TRAINING: the `RoundPlugin` publishes the round's model (`on_selected`);
the runtime runs the methods' before-training steps
(`ursa.coordinator.step_runner`, opened once the plugin says what the round
trains, `round_info`) and then tells the plugin to train (`on_steps_done`);
the plugin runs until complete (or the training deadline), then the round is
marked complete in the store (once), its steps are closed, and the next one
opens, or a new key epoch first, or the federation ends
(`ursa.coordinator.ending`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set
from dataclasses import dataclass

import numpy as np

from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.ending import Ending
from ursa.coordinator.epoch_work import EpochSets, EpochWork
from ursa.coordinator.plugin import EpochView, RoundPlugin
from ursa.coordinator.presence import churn
from ursa.coordinator.round_state import Stage, advance
from ursa.coordinator.selection import SelectionError
from ursa.coordinator.selection_method import (
    Selection,
    SelectionMethod,
    SelectionRequest,
)
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import StageMachine
from ursa.coordinator.step_runner import StepRunner
from ursa.coordinator.store_slot import StoreSlot
from ursa.coordinator.telemetry import Telemetry
from ursa.coordinator.training_health import HEALTH_KEY, TrainingHealth
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import COORDINATOR, RoundAnnounce, SelectionResult

__all__ = ["MIN_ANNOUNCE_INTERVAL_S", "RoundCycle", "RoundWork"]

logger = logging.getLogger("ursa.coordinator")

MIN_ANNOUNCE_INTERVAL_S = 1.0
"""Re-announcements of a round are at least this far apart, whatever a method asks."""


@dataclass
class RoundWork:
    """The current round, as the coordinator works on it."""

    round: int
    epoch: int
    announce: bytes
    selected: tuple[str, ...] | None = None
    result: bytes | None = None


class RoundCycle:
    """SELECTING and TRAINING, and the current round (module docstring).

    Args:
        config: Rounds, K, tries, deadlines, churn and epoch limits.
        stages: The run's `RoundState`.
        selection: The federation's selection method.
        plugin: The training plugin.
        steps: The methods' before-training steps, run before it trains.
        ending: Decides and announces the end of the federation.
        outgoing: The signing point and outbox.
        telemetry: Told of each completed round.
        rng: The generator selection requests carry.
        clock: Seconds (the announce rate limit).
        online: Who the coordinator counts as online (a live set).
        epoch: The current key epoch's working copy, or None.
        epoch_view: The current key epoch's public data, or None.
        epoch_sets: Who the current key epoch's rounds draw from, or None.
        start_key_epoch: Starts a new key epoch without the given devices.
        health: The selected devices' streaks of failed rounds.
        sit_out: Leaves a device out of the current key epoch (and why).
        sitting_out: The devices sitting the current key epoch out.
        store: The runtime's store (rounds, selections, streaks).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        stages: StageMachine,
        selection: SelectionMethod,
        plugin: RoundPlugin,
        steps: StepRunner,
        ending: Ending,
        outgoing: SigningPoint,
        telemetry: Telemetry,
        rng: np.random.Generator,
        clock: Clock,
        online: Set[str],
        epoch: Callable[[], EpochWork | None],
        epoch_view: Callable[[], EpochView | None],
        epoch_sets: Callable[[], EpochSets | None],
        start_key_epoch: Callable[[float, frozenset[str]], None],
        health: TrainingHealth,
        sit_out: Callable[[str, str], None],
        sitting_out: Callable[[], Set[str]],
        store: StoreSlot,
    ) -> None:
        self._config = config
        self._stages = stages
        self._selection = selection
        self._plugin = plugin
        self._steps = steps
        self._ending = ending
        self._outgoing = outgoing
        self._telemetry = telemetry
        self._rng = rng
        self._clock = clock
        self._online = online
        self._epoch = epoch
        self._epoch_view = epoch_view
        self._epoch_sets = epoch_sets
        self._start_key_epoch = start_key_epoch
        self._health = health
        self._sit_out = sit_out
        self._sitting_out = sitting_out
        self._store = store
        self._work: RoundWork | None = None
        self._announced_at = float("-inf")
        """When the open round was last re-announced (rate limit)."""
        self._explicit_replies = False
        """Whether the open round's announce asks every online device to answer
        (decided once, when it opens: a re-announce keeps the round's rule)."""

    @property
    def work(self) -> RoundWork | None:
        """The current round, as the coordinator works on it (None: none open)."""
        return self._work

    def restore_health(self) -> None:
        """Reload the devices' failure streaks (the service has started)."""
        self._health.restore(self._store.store.get_meta(HEALTH_KEY))

    def forget(self) -> None:
        """A new key epoch: no round is open until it is keyed."""
        self._work = None
        self._health.new_epoch()

    def restore(self, index: int) -> None:
        """Reload round ``index`` if it belongs to the current key epoch."""
        store, epoch = self._store.store, self._epoch()
        record = store.round(index) if index else None
        if record is None or epoch is None or record.epoch != epoch.epoch:
            self._work = None  # none yet, or of an earlier epoch: a new one is keyed
            return
        self._work = RoundWork(
            record.round,
            record.epoch,
            record.announce,
            selected=record.selected,
            result=record.result,
        )
        self._explicit_replies = _asks_every_answer(record.announce)

    def start_round(self, now: float) -> None:
        """Open the next round, or rekey first, or finish."""
        cfg = self._config
        work = self._epoch()
        if self._ending.is_due(self._store.store, self._stages.state.round):
            self._stages.advance(Stage.DONE, now, None)
            self._ending.announce(self._store.store.completed_rounds())
            return
        assert work is not None, "a round needs a key epoch"
        view = self._epoch_view()
        assert view is not None
        unusable = self._selection.epoch_unusable(view, self._online) or (
            self._churned()
        )
        epoch_full = (
            cfg.rounds_per_epoch > 0
            and self._store.store.rounds_in_epoch(work.epoch) >= cfg.rounds_per_epoch
        )
        if self._stages.state.rekey or unusable or epoch_full:
            why = unusable or "rekey"
            logger.info(
                "new key epoch before round %d (%s)", self._stages.state.round + 1, why
            )
            self._start_key_epoch(now, frozenset({work.agent}))
            return
        index = self._stages.state.round + 1
        self._explicit_replies = cfg.selection.explicit_replies(len(self._online))
        payload = self._announce(index, work.epoch)
        self._store.store.add_round(index, work.epoch, payload)
        self._work = RoundWork(index, work.epoch, payload)
        self._stages.set(
            advance(self._stages.state, Stage.SELECTING, round=index, deadline_at=None)
        )
        self._outgoing.send_raw(payload, "round_announce", None)
        self._announced_at = now
        request = self.selection_request(now)
        if request is not None:
            self._selection.open_round(request)

    def _churned(self) -> str | None:
        """Why the fleet's churn needs a new key epoch (None: it does not).

        Measured against the devices online when the key epoch started (its
        recipients), so a device that sits out does not count as churn; the
        counts are kept per event (`EpochSets`), so the check is O(1).

        Only with a quorum online: short of one, the current epoch goes on
        rather than wait in enrolment for devices that may never come back.
        """
        cfg = self._config
        sets = self._epoch_sets()
        if sets is None:
            return None
        started, online = len(sets.work.members), len(self._online)
        full = started >= cfg.registry.max_parties  # joiners could not join
        change = churn(started, len(sets.members_online), online, joiners=not full)
        if cfg.rekey_on_churn <= 0 or change <= cfg.rekey_on_churn:
            return None
        if online < cfg.epoch_quorum():
            return None
        return f"the online fleet changed by {change:.0%} since the key epoch"

    def _announce(self, index: int, epoch: int) -> bytes:
        cfg = self._config
        return self._outgoing.encode(
            RoundAnnounce(
                federation=cfg.federation,
                round=index,
                sender=COORDINATOR,
                epoch=epoch,
                k=cfg.k,
                tries=cfg.tries,
                deadline_s=cfg.deadlines.volunteer_s,
                explicit_replies=self._explicit_replies,
            )
        )

    def reannounce(self) -> None:
        """Publish the open round's announce again, with a fresh message id."""
        work, now = self._work, self._clock()
        if work is None:
            return
        if now - self._announced_at < MIN_ANNOUNCE_INTERVAL_S:
            logger.info("round %d: announce rate-limited", work.round)
            return
        self._announced_at = now
        work.announce = self._announce(work.round, work.epoch)
        self._store.store.set_announce(work.round, work.announce)
        self._outgoing.send_raw(work.announce, "round_announce", None)

    def selection_request(self, now: float) -> SelectionRequest | None:
        """The open round's request to the selection method (None: no round)."""
        work, epoch = self._work, self._epoch()
        if work is None or epoch is None:
            return None
        sets = self._epoch_sets()
        assert sets is not None
        return SelectionRequest(
            round=work.round,
            epoch=work.epoch,
            k=self._config.k,
            eligible=sets.eligible,
            rng=self._rng,
            now=now,
            explicit_replies=self._explicit_replies,
            excluded=self._sitting_out(),
        )

    def stage_selecting(self, now: float) -> None:
        """Ask the federation's selection method for the round's K."""
        request = self.selection_request(now)
        if request is None:
            return
        method = self._selection
        selection = method.select(request)
        if selection is not None:
            epoch = self._epoch()
            registered: Set[str] = epoch.registered if epoch else set()
            self._select(now, _checked(selection, registered, request.k, method.name))

    def _select(self, now: float, selection: Selection) -> None:
        """Publish the signed selection and hand the round to the plugin."""
        work = self._work
        assert work is not None
        selected = tuple(sorted(selection.selected))
        result = self._outgoing.sign(
            SelectionResult(
                federation=self._config.federation,
                round=work.round,
                sender=COORDINATOR,
                selected=selected,
                try_index=selection.try_index,
            )
        )
        payload = self._outgoing.encode(result)
        work.selected = selected
        work.result = payload
        self._store.store.set_selection(
            work.round, selected, selection.try_index, payload
        )
        if selection.rekey:
            self._stages.mark_rekey()
        self._stages.advance(Stage.TRAINING, now, self._config.deadlines.training_s)
        logger.info(
            "round %d: selected %d devices (try %s)",
            work.round,
            len(selected),
            selection.try_index,
        )
        self.deliver_selection(payload)
        self.train(work)

    def train(self, work: RoundWork) -> None:
        """Hand the selected round to the plugin (again after a restart).

        Its steps open at the next training tick (`stage_training`).
        """
        assert work.selected is not None
        self._plugin.on_selected(work.round, work.selected, self._outgoing.send)
        self._steps.republish(work.round)  # only if they opened already

    def deliver_selection(self, payload: bytes) -> None:
        """Publish the signed selection, or under a private one tell each alone."""
        if not self._selection.private_selection:
            self._outgoing.send_raw(payload, "selection_result", None)
            return
        result = decode(payload)
        assert isinstance(result, SelectionResult)
        for device in result.selected:
            own = result.model_copy(
                update={
                    "selected": (device,),
                    "message_id": derived_id(result.message_id, device),
                    "signature": b"",
                }
            )
            self._outgoing.send(self._outgoing.sign(own), device)

    def stage_training(self, now: float) -> None:
        """Tick the plugin, run the steps; complete the round when it is done.

        (Or at the deadline.) The steps open once the plugin says what the
        round trains (after its tick: FedDisk may start a round in it); once
        they are done, the plugin is told to train.
        """
        work = self._work
        if work is None:
            return
        steps, send = self._steps, self._outgoing.send
        self._plugin.on_tick(work.round, now, send)
        if not steps.has_opened(work.round):
            info = self._plugin.round_info(work.round)
            if info is not None:
                steps.open(info, now)
        if steps.on_tick(work.round, now):
            self._plugin.on_steps_done(work.round, send)
        done = self._plugin.is_complete(work.round)
        if not done and not self._stages.deadline_passed(now):
            return
        if not done:
            logger.warning("round %d: training deadline passed", work.round)
        else:
            steps.close(work.round)
        if self._store.store.complete_round(work.round):
            self._telemetry.round_completed(work.round, work.selected or ())
            self._count_failures(work.round)
        self.start_round(now)

    def _count_failures(self, round_index: int) -> None:
        """Streaks of failed rounds: two show a device failing, N sit it out."""
        outcome = self._plugin.round_outcome(round_index)
        if outcome is None:
            return
        self._health.trained(outcome.contributed)
        for device in sorted(outcome.failed):
            if self._health.failed(device, round_index, "failed"):
                streak = self._health.failing()[device]
                logger.error(
                    "%s failed %d training rounds in a row (the last: round %d); "
                    "it sits this key epoch out: look at its log, fix its data "
                    "or model and restart it",
                    device,
                    streak.count,
                    round_index,
                )
                self._sit_out(device, f"failed {streak.count} training rounds in a row")
        self._store.store.set_meta(HEALTH_KEY, self._health.to_json())


def _asks_every_answer(announce: bytes) -> bool:
    """Whether a stored announce signed explicit replies (False: unreadable)."""
    try:
        message = decode(announce)
    except ProtocolError:  # an older version's announce: silence, as it ran
        logger.warning("the open round's stored announce does not decode")
        return False
    return isinstance(message, RoundAnnounce) and message.explicit_replies


def _checked(
    selection: Selection, registered: Set[str], k: int, method: str
) -> Selection:
    """A method's selection, refused unless it is 1..K distinct registered devices.

    Fewer than K happens only in Dubhe's repair when too few devices are
    alive; a device that went offline after volunteering may still be named
    (training copes with drop-outs). Anything else is a bug in the method.

    Raises:
        SelectionError: a bug in the method (the tick logs it and retries).
    """
    selected = selection.selected
    chosen = set(selected)
    if len(chosen) != len(selected) or not 0 < len(chosen) <= k:
        raise SelectionError(f"{method} selected {len(chosen)} devices, K={k}")
    if not all(d in registered for d in chosen):
        raise SelectionError(f"{method} selected devices not registered in the epoch")
    return selection
