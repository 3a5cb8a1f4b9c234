"""The open round as Dubhe works on it: its step, window, answers and tries.

`RoundProgress` mirrors what Dubhe's records keep of the round (read back
after a restart) plus what lives in memory only (the per-try counts, the
agent's verified answer, the members dropped this round); `DubheStep` names
where the round is. The steps (`ursa.coordinator.methods.dubhe.selection`,
`ursa.coordinator.methods.dubhe.rank_step`,
`ursa.coordinator.methods.dubhe.agent_step`) read and advance it.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

from ursa._compat import StrEnum
from ursa.coordinator.methods.dubhe.tries import without
from ursa.coordinator.selection_method import Selection
from ursa.crypto.paillier import EncryptedVector

__all__ = ["DubheStep", "RoundProgress"]


class DubheStep(StrEnum):
    """Where Dubhe is in the open round."""

    RANKS = "ranks"
    """Stratified draw: the epoch's ranks are being handed out."""
    VOLUNTEERING = "volunteering"
    DISTRIBUTIONS = "distributions"
    AGENT = "agent"
    SELECTED = "selected"
    """The round's selection was handed to the runtime; late answers are refused."""


@dataclass
class RoundProgress:
    """The open round as Dubhe works on it (mirrors the store's round record)."""

    round: int
    epoch: int
    step: DubheStep
    deadline_at: float
    volunteers: dict[str, tuple[bool, ...]] = field(default_factory=dict)
    """Every answer's draws (all-no ones too, under explicit replies)."""
    explicit: bool = False
    """The announce asked every online device to answer (`SelectionRequest`)."""
    yes: list[int] = field(default_factory=list)
    """Per try, how many volunteers drew yes (kept per message: O(H))."""
    tentative: tuple[tuple[str, ...], ...] | None = None
    distributions: dict[str, EncryptedVector] = field(default_factory=dict)
    candidates: tuple[int, ...] | None = None
    answer: Selection | None = None
    """The agent's verified choice, handed over at the next step."""
    retries: int = 0
    """Volunteering windows that closed short of K (each next one is longer)."""
    short_at: int | None = None
    """Answers held when the window last closed short of K: under explicit
    replies the next window closes early only once a new answer came, so a
    fleet of fewer than K online devices that have all answered waits the
    backoff out instead of re-announcing at every tick."""
    k: int = 0
    dropped: set[str] = field(default_factory=set)
    """Out of this round's tries: a malformed distribution, or a suspect of
    an all-bad agent answer (kept in memory: a restart asks again)."""
    bad_sums: tuple[int, ...] | None = None
    """Try indices of the agent's all-bad answer, for the next step to act on."""
    resums: int = 0

    def count(self, draws: tuple[bool, ...]) -> None:
        """Add one volunteer's draws to the per-try counts."""
        if len(self.yes) < len(draws):
            self.yes.extend([0] * (len(draws) - len(self.yes)))
        for h, drew in enumerate(draws):
            self.yes[h] += bool(drew)

    def all_answered(self, eligible: Set[str]) -> bool:
        """Under explicit replies: whether every eligible device has answered.

        O(1) until the answers are as many as the eligible devices, then one
        pass (a fleet under the threshold).
        """
        if not self.explicit or len(self.volunteers) < len(eligible):
            return False
        return all(d in self.volunteers for d in eligible)

    def members(self) -> set[str]:
        """Every device in some tentative set."""
        return {d for t in self.tentative or () for d in t}

    def tries(self) -> tuple[tuple[str, ...], ...]:
        """The tentative sets without the dropped members."""
        return without(self.tentative or (), self.dropped)
