"""Restart of the coordinator: reload state from SQLite and resume the stage.

After ``kill -9`` the store holds the `RoundState`, the key epoch (agent,
recipients, relayed public key, the sealing's completed pages, running
registry sum, published registry sum) and the round (announce, selection;
the selection method's progress; the balancing method's run).
`Recovery.restore` has each component reload its part and gives the current
stage a fresh deadline (the devices may have waited); `Recovery.resume`
re-publishes what that stage waits on and lets the selection method resume
its own steps (`SelectionMethod.resume`).
Every device answer carries a deterministic message id and every handler
records per device, so an answer given twice is recognised, never counted
twice.
"""

from __future__ import annotations

import json
import logging

from ursa.coordinator.balancing import Balancing
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.identity_refusals import REFUSAL_REKEYS_KEY, IdentityRefusals
from ursa.coordinator.key_epoch import KeyEpoch
from ursa.coordinator.presence import Presence
from ursa.coordinator.round_cycle import RoundCycle
from ursa.coordinator.round_state import RoundState, Stage
from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import STATE_KEY, StageMachine
from ursa.coordinator.store import CoordinatorStore

__all__ = ["Recovery"]

logger = logging.getLogger("ursa.coordinator")


class Recovery:
    """Reload and resume (module docstring); handed the parts that hold state.

    Args:
        config: The stages' deadlines.
        stages: The run's `RoundState`.
        rounds: The round cycle.
        devices: The enrolled devices.
        presence: Who is online.
        identity_refusals: The re-keys each device caused.
        key_epoch: The key epoch.
        selection: The selection method (it resumes its own steps).
        flicker: FLICKER's coordinator half, if the federation runs it.
        outgoing: The signing point and outbox.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        stages: StageMachine,
        rounds: RoundCycle,
        devices: EnrolledDevices,
        presence: Presence,
        identity_refusals: IdentityRefusals,
        key_epoch: KeyEpoch,
        selection: SelectionMethod,
        flicker: Balancing | None,
        outgoing: SigningPoint,
    ) -> None:
        self._config = config
        self._stages = stages
        self._rounds = rounds
        self._devices = devices
        self._presence = presence
        self._identity_refusals = identity_refusals
        self._key_epoch = key_epoch
        self._selection = selection
        self._flicker = flicker
        self._outgoing = outgoing

    def restore(self, store: CoordinatorStore, now: float) -> None:
        """Reload state from ``store``; give the current stage a fresh deadline."""
        self._rounds.restore_health()
        self._devices.restore()
        self._presence.restore(store.online() & set(self._devices.identities))
        self._identity_refusals.restore(store.get_meta(REFUSAL_REKEYS_KEY))
        raw = store.get_meta(STATE_KEY)
        state = None if raw is None else RoundState.from_json(json.loads(raw))
        self._key_epoch.restore(state)
        if self._flicker is not None:
            self._flicker.restore()
        if state is None:
            return
        self._rounds.restore(state.round)
        deadline_s = self._stage_deadline_s(state.stage)
        self._stages.resume(
            RoundState(
                stage=state.stage,
                epoch=state.epoch,
                round=state.round,
                deadline_at=None if deadline_s is None else now + deadline_s,
                rekey=state.rekey,
            )
        )
        logger.info(
            "resumed at stage %s, epoch %d, round %d (%d devices enrolled)",
            state.stage,
            state.epoch,
            state.round,
            len(self._devices.identities),
        )

    def _stage_deadline_s(self, stage: Stage) -> float | None:
        d = self._config.deadlines
        return {
            Stage.KEY_EPOCH: d.key_epoch_s,
            Stage.REGISTRATION: d.registration_s,
            Stage.TRAINING: d.training_s,
        }.get(stage)

    def resume(self, store: CoordinatorStore, now: float) -> None:
        """Re-publish what the restored stage waits on (devices answer idempotently)."""
        stage = self._stages.state.stage
        if stage is Stage.ENROLMENT:
            return
        last = store.last_result()
        if last is not None:
            self._rounds.deliver_selection(last)
        self._key_epoch.republish(stage)
        current = self._rounds.work
        if current is not None and stage in (Stage.SELECTING, Stage.TRAINING):
            self._outgoing.send_raw(current.announce, "round_announce", None)
            request = self._rounds.selection_request(now)
            if request is not None:
                self._selection.resume(request)
        if stage is Stage.TRAINING and current is not None and current.selected:
            self._rounds.train(current)
        if self._flicker is not None and stage is Stage.BALANCING:
            self._flicker.resume()
