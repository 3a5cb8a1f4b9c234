"""Round stages: open a round, let the selection method choose, train, repeat.

SELECTING: the runtime publishes the round's retained `RoundAnnounce`, then
asks the federation's `SelectionMethod` at every step (every tick and after
every admitted message) until it names the round's K participants (a step
costs O(1) in the fleet's size: the eligible devices are kept per event,
`ursa.coordinator.core.EpochSets`); the
method's own steps and windows (Dubhe's volunteers, distributions and agent)
are its business (`ursa.coordinator.methods`). The runtime checks the
answer (K distinct eligible devices), signs the `SelectionResult`, stores
it with the round and publishes it; when the method says the selection is
private (Dubhe's stratified draw), each selected device instead gets its own
signed `SelectionResult` naming only itself, on its down topic.

TRAINING: the `RoundPlugin` runs until complete (or the training deadline),
then the round is marked complete in the store (once) and the next one opens.
"""

from __future__ import annotations

import logging
from collections.abc import Set

from ursa.coordinator.core import RoundWork, ServiceCore, derived_id
from ursa.coordinator.federation_end import end_message, write_final_model
from ursa.coordinator.presence import churn
from ursa.coordinator.rounds import Stage, advance
from ursa.coordinator.selection import SelectionError
from ursa.coordinator.selection_method import Selection, SelectionRequest
from ursa.protocol.envelope import decode
from ursa.protocol.messages import COORDINATOR, RoundAnnounce, SelectionResult

__all__ = ["MIN_ANNOUNCE_INTERVAL_S", "RoundStages"]

logger = logging.getLogger("ursa.coordinator")

MIN_ANNOUNCE_INTERVAL_S = 1.0
"""Re-announcements of a round are at least this far apart, whatever a method asks."""


class RoundStages(ServiceCore):
    """SELECTING and TRAINING; the runtime half of `SelectionContext`."""

    def _start_round(self, now: float) -> None:
        """Open the next round, or rekey first, or finish."""
        cfg = self._config
        work = self._epoch
        if self._store.completed_rounds() >= cfg.rounds:
            self._advance(Stage.DONE, now, None)
            logger.info("all %d rounds complete", cfg.rounds)
            self._end_federation()
            return
        if self._target_reached():
            self._advance(Stage.DONE, now, None)
            self._end_federation()
            return
        assert work is not None, "a round needs a key epoch"
        view = self._epoch_view()
        assert view is not None
        unusable = self._selection.epoch_unusable(view, self._online) or (
            self._churned()
        )
        epoch_full = (
            cfg.rounds_per_epoch > 0
            and self._store.rounds_in_epoch(work.epoch) >= cfg.rounds_per_epoch
        )
        if self._state.rekey or unusable or epoch_full:
            why = unusable or "rekey"
            logger.info(
                "new key epoch before round %d (%s)", self._state.round + 1, why
            )
            self._start_key_epoch(now, frozenset({work.agent}))
            return
        index = self._state.round + 1
        payload = self._announce(index, work.epoch)
        self._store.add_round(index, work.epoch, payload)
        self._round = RoundWork(index, work.epoch, payload)
        self._set_state(
            advance(self._state, Stage.SELECTING, round=index, deadline_at=None)
        )
        self._send_raw(payload, "round_announce", None)
        self._announced_at = now
        request = self._selection_request(now)
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

    def _target_reached(self) -> bool:
        """Whether the last round's accuracy reached ``target_accuracy``."""
        target = self._config.target_accuracy
        if target is None:
            return False
        accuracy = self._plugin.last_metrics().get("accuracy")
        if not isinstance(accuracy, int | float) or not accuracy >= target:
            return False
        logger.info(
            "round %d reached accuracy %.4f >= target %.4f; ending the federation",
            self._state.round,
            accuracy,
            target,
        )
        return True

    def _end_federation(self) -> None:
        """Publish the signed, retained `FederationEnd`; write the final model."""
        rounds = self._store.completed_rounds()
        final = self._plugin.final_model(self._send)
        message = end_message(self._config.federation, rounds, final)
        self._send(self._sign(message), None)
        if final is None:
            logger.info("federation over after %d rounds (no model)", rounds)
            return
        logger.info(
            "federation over after %d rounds: final %s version %d %s",
            rounds,
            final.model,
            final.version,
            dict(message.metrics),
        )
        folder = self._config.final_model_dir or self._config.state_dir / "final"
        output = self._final_output
        try:
            written = write_final_model(
                folder,
                final,
                rounds=rounds,
                methods=self._config.method_names(),
                architecture=None if output is None else output.card,
                export=None if output is None else output.export,
            )
        except OSError as exc:
            logger.error("could not write the final model to %s: %s", folder, exc)
            return
        logger.info("final model written to %s: %s", folder, ", ".join(written))

    def _announce(self, index: int, epoch: int) -> bytes:
        cfg = self._config
        return self._encode(
            RoundAnnounce(
                federation=cfg.federation,
                round=index,
                sender=COORDINATOR,
                epoch=epoch,
                k=cfg.k,
                tries=cfg.tries,
                deadline_s=cfg.deadlines.volunteer_s,
            )
        )

    def reannounce(self) -> None:
        """Publish the open round's announce again, with a fresh message id."""
        work, now = self._round, self._clock()
        if work is None:
            return
        if now - self._announced_at < MIN_ANNOUNCE_INTERVAL_S:
            logger.info("round %d: announce rate-limited", work.round)
            return
        self._announced_at = now
        work.announce = self._announce(work.round, work.epoch)
        self._store.set_announce(work.round, work.announce)
        self._send_raw(work.announce, "round_announce", None)

    def _selection_request(self, now: float) -> SelectionRequest | None:
        work, epoch = self._round, self._epoch
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
        )

    def _stage_selecting(self, now: float) -> None:
        """Ask the federation's selection method for the round's K."""
        request = self._selection_request(now)
        if request is None:
            return
        method = self._selection
        selection = method.select(request)
        if selection is not None:
            registered: Set[str] = self._epoch.registered if self._epoch else set()
            self._select(now, _checked(selection, registered, request.k, method.name))

    def _select(self, now: float, selection: Selection) -> None:
        """Publish the signed selection and hand the round to the plugin."""
        work = self._round
        assert work is not None
        selected = tuple(sorted(selection.selected))
        result = self._sign(
            SelectionResult(
                federation=self._config.federation,
                round=work.round,
                sender=COORDINATOR,
                selected=selected,
                try_index=selection.try_index,
            )
        )
        payload = self._encode(result)
        work.selected = selected
        work.result = payload
        self._store.set_selection(work.round, selected, selection.try_index, payload)
        if selection.rekey:
            self._mark_rekey()
        self._advance(Stage.TRAINING, now, self._config.deadlines.training_s)
        logger.info(
            "round %d: selected %d devices (try %s)",
            work.round,
            len(selected),
            selection.try_index,
        )
        self._deliver_selection(payload)
        self._plugin.on_selected(work.round, work.selected, self._send)

    def _deliver_selection(self, payload: bytes) -> None:
        """Publish the signed selection, or under a private one tell each alone."""
        if not self._selection.private_selection:
            self._send_raw(payload, "selection_result", None)
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
            self._send(self._sign(own), device)

    def _stage_training(self, now: float) -> None:
        work = self._round
        if work is None:
            return
        self._plugin.on_tick(work.round, now, self._send)
        done = self._plugin.is_complete(work.round)
        if not done and not self._deadline_passed(now):
            return
        if not done:
            logger.warning("round %d: training deadline passed", work.round)
        if self._store.complete_round(work.round):
            self._telemetry.round_completed(work.round, work.selected or ())
        self._start_round(now)


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
