"""Dubhe's VOLUNTEERING step: the devices' draws, the window, the tries.

The retained `RoundAnnounce` asks every registered device for its H draws.
Under explicit replies every online registered device answers and the
window closes once all have; under silence-means-no a device answers only
with a yes, and the window closes once every try has K volunteers; else at
its end. Too few devices to choose from re-announce the round with a window
twice as long each time, up to `MAX_BACKOFF`; otherwise the tries are made
(surplus trimmed, shortfall topped up uniformly, devices at the
participation cap held back: `ursa.coordinator.methods.dubhe.tries`,
`ursa.coordinator.methods.dubhe.participation`). With H = 1 that try is the
selection; else the DISTRIBUTIONS step
(`ursa.coordinator.methods.dubhe.distribution_step`) takes over.
"""

from __future__ import annotations

import logging
from collections.abc import Set

from ursa.coordinator.methods.dubhe.distribution_step import DistributionStep
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.methods.dubhe.round_progress import RoundProgress
from ursa.coordinator.methods.dubhe.tries import make_tries, short_tries
from ursa.coordinator.selection_method import (
    Selection,
    SelectionContext,
    SelectionRequest,
)
from ursa.protocol.messages import ErrorCode, Volunteer
from ursa.protocol.router import RejectedError

__all__ = ["MAX_BACKOFF", "VolunteerStep"]

logger = logging.getLogger("ursa.coordinator.dubhe")

MAX_BACKOFF = 16
"""A short volunteering window is retried 2, 4, ... up to 16 windows later."""


class VolunteerStep:
    """The volunteering window of each round.

    Args:
        ctx: The runtime's context (send, store, the key epoch, who is online).
        tries: H, the tentative sets per round.
        volunteer_s: The volunteering window (and each re-announce's).
        cap: The participation cap (None: none).
        members: The next step (H > 1), handed the tries.
    """

    def __init__(
        self,
        ctx: SelectionContext,
        *,
        tries: int,
        volunteer_s: float,
        cap: ParticipationCap | None,
        members: DistributionStep,
    ) -> None:
        self._ctx = ctx
        self._tries = tries
        self._volunteer_s = volunteer_s
        self._cap = cap
        self._cap_loaded = False
        self._members = members

    def tick(self, work: RoundProgress, request: SelectionRequest) -> Selection | None:
        """Close the window once it knows enough (or at its end); make the tries."""
        eligible = request.eligible  # kept per event: its size costs O(1)
        if work.explicit:  # every eligible device answers: wait for them all
            done = work.all_answered(eligible) and work.short_at != len(work.volunteers)
        else:  # silence means no: K volunteers per try are all it can know
            done = len(work.yes) == self._tries and min(work.yes) >= request.k
        if not (done or request.now >= work.deadline_at):
            return None
        volunteers = {  # one that sits out since it volunteered takes no place
            d: draws
            for d, draws in work.volunteers.items()
            if d not in request.excluded
        }
        if short_tries(volunteers, eligible, request.k):
            work.retries += 1  # wait longer each time: never a re-announce loop
            window = self._volunteer_s * min(2**work.retries, MAX_BACKOFF)
            logger.warning(
                "round %d: %d eligible devices online < K=%d; re-announcing, "
                "next try in %.0f s",
                work.round,
                len(eligible),
                request.k,
                window,
            )
            work.deadline_at = request.now + window
            work.short_at = len(work.volunteers)
            self._ctx.reannounce()
            return None
        logger.info(
            "round %d: %d answers (yes per try %s), %d eligible, %s",
            work.round,
            len(work.volunteers),
            work.yes,
            len(eligible),
            "explicit replies" if work.explicit else "silence means no",
        )
        tentative = make_tries(
            volunteers,
            eligible,
            request.k,
            self._tries,
            request.rng,
            self._held_back(work.round, eligible, request.k),
        )
        work.tentative = tentative
        self._kept().set_tries(work.round, tentative)
        if self._tries == 1:
            return Selection(tentative[0], 0)
        self._members.ask(work, request.now)
        return None

    def on_volunteer(self, work: RoundProgress, message: Volunteer) -> None:
        """A device's draws for the open round (while its window is open)."""
        device = message.sender  # admission checked it is the topic's device
        ctx = self._ctx
        epoch = ctx.epoch_view()
        if epoch is None or device not in epoch.registered:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"not registered in key epoch {work.epoch}"
            )
        if len(message.draws) != self._tries:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"{len(message.draws)} draws for {self._tries} tries",
            )
        if not (work.explicit or any(message.draws)):
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"round {work.round}: silence means no; an all-no answer is not sent",
            )
        known = work.volunteers.get(device)
        if known == message.draws:  # a re-sent answer (a restart): counted once
            logger.info("duplicate volunteer of %s ignored", device)
            return
        if known is not None:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"round {work.round} is answered already, with other draws",
            )
        self._kept().add_volunteer(work.round, device, message.draws)
        work.volunteers[device] = message.draws
        work.count(message.draws)

    def restore_cap(self, round_index: int) -> None:
        """Once per start: the cap's counts from the store's last window of rounds."""
        cap = self._cap
        if cap is None or self._cap_loaded:
            return
        self._cap_loaded = True
        store = self._ctx.store
        first = max(1, round_index - cap.window + 1)
        stored = (store.round(r) for r in range(first, round_index))
        cap.restore(
            (r.round, r.selected) for r in stored if r is not None and r.selected
        )

    def _held_back(
        self, round_index: int, eligible: Set[str], k: int
    ) -> frozenset[str]:
        """Devices over the cap this round; none when the rest are fewer than K."""
        if self._cap is None:
            return frozenset()
        held = self._cap.capped(round_index)
        if not held:
            return held
        if len(eligible) - sum(1 for d in held if d in eligible) < k:
            logger.warning(
                "round %d: without the %d devices at the participation cap "
                "fewer than K=%d are eligible; the cap is lifted this round",
                round_index,
                len(held),
                k,
            )
            return frozenset()
        logger.info(
            "round %d: %d devices at the participation cap (%d of %d rounds) "
            "sit this round out",
            round_index,
            len(held),
            self._cap.limit,
            self._cap.window,
        )
        return held

    def _kept(self) -> DubheRecords:
        return DubheRecords(self._ctx.store)
