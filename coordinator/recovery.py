"""Restart of the coordinator: reload state from SQLite and resume the stage.

After ``kill -9`` the store holds the `RoundState`, the key epoch (agent,
recipients, relayed public key, the sealing's completed pages, running
registry sum, published registry sum) and the round (announce, selection;
the selection method's progress).
`Recovery._restore` rebuilds the working copies and gives the current stage
a fresh deadline (the devices may have waited); `Recovery._resume`
re-publishes what that stage waits on and lets the selection method resume
its own steps (`SelectionMethod.resume`). Every
device answer carries a deterministic message id and every handler records
per device, so an answer given twice is recognised, never counted twice.
"""

from __future__ import annotations

import json
import logging

from ursa.coordinator.core import (
    SAT_OUT_KEY,
    STATE_KEY,
    EpochWork,
)
from ursa.coordinator.identity_refusals import REFUSAL_REKEYS_KEY
from ursa.coordinator.keys import SEAL_PAGES_KEY, EpochStages, sealed_through
from ursa.coordinator.rounds import RoundState, Stage
from ursa.coordinator.seal_pages import SealPaging
from ursa.crypto.paillier import PaillierPublicKey, encrypted_vector_from
from ursa.protocol.envelope import decode
from ursa.protocol.messages import AgentPublicKey

__all__ = ["Recovery"]

logger = logging.getLogger("ursa.coordinator")


class Recovery(EpochStages):
    """Reload and resume: the stages plus what a restart needs."""

    def _apply_revocations(self) -> None:
        """Apply a changed enrolment list now, not at the next start.

        Devices revoked (or enrolled again with new keys) while running are
        forgotten at once, so their messages are refused from then on. A
        forgotten device that is a member of the current key epoch holds its
        secret key (agent or not, it could decrypt the epoch's sums while its
        broker login lives), so the next round waits for a new key epoch
        without it. A ``stat`` per call (`EnrolmentWatch`); the O(fleet)
        comparison only when the file changed.
        """
        stale = self._devices.revocations()
        work = self._epoch
        holders = sorted(stale.keys() & work.members) if work is not None else []
        if holders and work is not None:
            logger.warning(
                "key epoch %d's key is held by %s: a new key epoch before the "
                "next round",
                work.epoch,
                ", ".join(f"{d} ({stale[d]})" for d in holders),
            )
            self._stages.mark_rekey()

    def _restore(self, now: float) -> None:
        """Reload state from the store and give the current stage a fresh deadline."""
        store = self._store
        self._stages.open(store)
        self._rounds.open(store)
        self._devices.restore(store)
        self._presence.restore(store.online() & set(self._enrolled))
        self._identity_refusals.restore(store.get_meta(REFUSAL_REKEYS_KEY))
        sat_out = json.loads(store.get_meta(SAT_OUT_KEY) or "{}")
        self._sat_out = {str(d): int(e) for d, e in sat_out.items()}
        self._rebuild_ready()
        raw = store.get_meta(STATE_KEY)
        if raw is None:
            return
        state = RoundState.from_json(json.loads(raw))
        record = store.epoch(state.epoch) if state.epoch else None
        if record is not None:
            sealed = sealed_through(
                store.get_meta(SEAL_PAGES_KEY),
                record.epoch,
                self._config.seal_page_size,
            )
            work = EpochWork(
                record.epoch,
                record.agent,
                record.recipients,
                record.notice,
                public_key_msg=record.public_key_msg,
                registered=set(record.registered),
                registry_sum_msg=record.registry_sum_msg,
                sealing=SealPaging.plan(
                    record.recipients,
                    record.agent,
                    page_size=self._config.seal_page_size,
                    done_through=sealed,
                ),
            )
            if record.public_key_msg is not None:
                message = decode(record.public_key_msg)
                assert isinstance(message, AgentPublicKey)
                work.public_key = PaillierPublicKey.from_bytes(message.public_key)
                if record.running_sum is not None:
                    work.running_sum = encrypted_vector_from(
                        record.running_sum, work.public_key
                    )
            self._epoch = work
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
            len(self._enrolled),
        )

    def _stage_deadline_s(self, stage: Stage) -> float | None:
        d = self._config.deadlines
        return {
            Stage.KEY_EPOCH: d.key_epoch_s,
            Stage.REGISTRATION: d.registration_s,
            Stage.TRAINING: d.training_s,
        }.get(stage)

    def _resume(self, now: float) -> None:
        """Re-publish what the restored stage waits on (devices answer idempotently)."""
        stage = self._state.stage
        if stage is Stage.ENROLMENT:
            return
        last = self._store.last_result()
        if last is not None:
            self._rounds.deliver_selection(last)
        work, current = self._epoch, self._rounds.work
        if work is not None:
            self._outgoing.send_raw(work.notice, "key_epoch_start", None)
            if work.public_key_msg is not None:
                self._outgoing.send_raw(work.public_key_msg, "agent_public_key", None)
            if work.registry_sum_msg is not None:
                self._outgoing.send_raw(work.registry_sum_msg, "registry_sum", None)
        sealing = None if work is None else work.sealing
        unsealed = sealing is not None and not sealing.is_complete
        if stage is Stage.KEY_EPOCH or (stage is Stage.REGISTRATION and unsealed):
            self._send_seal_request()  # the pages not known complete, again
        if current is not None and stage in (Stage.SELECTING, Stage.TRAINING):
            self._outgoing.send_raw(current.announce, "round_announce", None)
            request = self._rounds.selection_request(now)
            if request is not None:
                self._selection.resume(request)
        if stage is Stage.TRAINING and current is not None and current.selected:
            self._plugin.on_selected(
                current.round, current.selected, self._outgoing.send
            )
