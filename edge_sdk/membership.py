"""`RunMembership`: the coordinator run this device joined, and messages of others.

A device joins a run only through a signed `EnrolResult` (the client checks
it). The first run it learns is adopted as is; a different run of the same
pinned coordinator means it was reset, and the old run's state goes (the
``forget`` the client hands over). A run left before is refused (a
replayed acceptance). Messages of a run not joined yet (nor left) are kept,
a few runs and messages at most, and handed back in order once it is; the
broker may deliver a new run's retained notices before the acceptance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ursa.edge_sdk.state_dir import DeviceStateDir, StoredRun
from ursa.protocol.messages import BaseMessage

__all__ = ["EARLY_PER_RUN", "EARLY_RUNS", "HELLO_ON_NEW_RUN_S", "RunMembership"]

logger = logging.getLogger("ursa.edge_sdk")

HELLO_ON_NEW_RUN_S = 5.0
"""At most one Hello this often for messages of a run the device never joined."""

EARLY_PER_RUN = 256
"""Messages of a run not joined yet that are kept (its retained notices and
what its coordinator sent before the device's `EnrolResult` arrived)."""
EARLY_RUNS = 2
"""Runs not joined yet whose messages are kept at once (the newest)."""


class RunMembership:
    """The joined run, the runs left, and what other runs sent meanwhile.

    Args:
        device_id: This device (for its log lines).
        say_hello: Sends a Hello (a message of an unknown run may mean the
            coordinator was reset: its signed `EnrolResult` says).
    """

    def __init__(self, *, device_id: str, say_hello: Callable[[], None]) -> None:
        self.device_id = device_id
        self._say_hello = say_hello
        self.current = StoredRun()
        """The run joined and the runs left (persisted in the state dir)."""
        self._early: dict[str, list[BaseMessage]] = {}
        self._replay: list[BaseMessage] = []
        self._drops: dict[str, int] = {}
        self._hello_at = float("-inf")

    @property
    def run(self) -> str:
        """The joined run's id ("" before any)."""
        return self.current.run

    def restore(self, store: DeviceStateDir) -> None:
        """The run joined before a restart (a damaged record: the next is joined)."""
        try:
            self.current = store.load_run()
        except ValueError as exc:
            logger.warning("ignoring the stored run (%s); the next one is joined", exc)

    def enter(
        self, run: str, store: DeviceStateDir, forget: Callable[[], None]
    ) -> None:
        """Join the run a signed `EnrolResult` names (``forget``: the old run's state).

        Raises:
            ValueError: the run is over for this device.
        """
        current = self.current
        if run == current.run:
            return
        if not run or run in current.left:
            raise ValueError(f"run {run or '(none)'} is over; not joining it again")
        if current.run:
            removed = store.leave_run()
            forget()
            logger.warning(
                "%s: the coordinator started a new run %s (was %s); joining it "
                "and dropping the old run's state (%s)",
                self.device_id,
                run,
                current.run,
                ", ".join(removed) or "nothing stored",
            )
        self.current = StoredRun(
            run, (*current.left, current.run) if current.run else ()
        )
        store.save_run(self.current)
        self._replay.extend(self._early.pop(run, ()))  # what came before this
        self._early.clear()

    def next_joined(self) -> BaseMessage | None:
        """The next message the joined run sent before its acceptance (in order)."""
        while self._replay:
            message = self._replay.pop(0)
            if message.run == self.current.run:
                return message
        return None

    def foreign(self, kind: str, message: BaseMessage) -> None:
        """A message of a run this device has not joined: counted, perhaps kept.

        An older run's messages (retained, or queued in the broker while the
        coordinator was reset) must not act on the new run's state, and a
        newer run is joined only through a signed `EnrolResult`; each run is
        logged once.
        """
        run = message.run
        count = self._drops.get(run, 0)
        self._drops[run] = count + 1
        now = time.monotonic()
        fresh = bool(run) and run not in self.current.left
        if fresh and now - self._hello_at >= HELLO_ON_NEW_RUN_S:
            self._hello_at = now
            self._say_hello()
        if count == 0:  # expected: a new run's notices come before its acceptance
            logger.info(
                "%s: dropping messages of run %s (%s first); this device is in run %s",
                self.device_id,
                run or "(none)",
                kind,
                self.current.run or "(none yet)",
            )
        if fresh:
            self._keep(message)

    def _keep(self, message: BaseMessage) -> None:
        kept = self._early.setdefault(message.run, [])
        if len(kept) < EARLY_PER_RUN:
            kept.append(message)
        while len(self._early) > EARLY_RUNS:
            del self._early[next(iter(self._early))]

    def drops(self) -> dict[str, int]:
        """Messages dropped per foreign run id, so far."""
        return dict(self._drops)
