"""The correction loop of a FLICKER run as open requests (pure: no I/O, no clock).

After the ring, the coordinator alternates two kinds of request
(the FLICKER paper, §2.1.2-§2.1.4), each with a step number and a deadline:

* ``cosine``: every localisation candidate returns its masked cosine; when
  all answered, or at the deadline with those that did, the dominant device
  is picked (a silent candidate is not chosen this time; when none answers,
  the run ends as `StopReason.ALL_SATURATED`: nobody left can correct);
* ``resample``: the dominant device returns its count update and saturation
  flag; a silent dominant device is treated as saturated.

`CorrectionLoop` checks each reply against the open request (kind, step,
sender, once per sender), feeds the decrypted values to the
`ursa.coordinator.methods.flicker.algorithm` state machine and opens the next request,
until
the state is DONE. The caller sends the requests and decrypts the replies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy.typing as npt

from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.protocol.messages import ErrorCode

__all__ = ["CorrectionLoop", "LoopError", "Request"]

RequestKind = Literal["cosine", "resample"]


class LoopError(ValueError):
    """A reply the loop refuses; ``code`` is an `ErrorCode` value."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class Request:
    """An open request: who must answer, by when, and who did."""

    kind: RequestKind
    step: int
    targets: frozenset[str]
    deadline_at: float
    similarities: dict[str, float] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)

    @property
    def missing(self) -> tuple[str, ...]:
        """Targets that have not answered, sorted."""
        return tuple(sorted(self.targets - self.answered))


class CorrectionLoop:
    """Localisation and resampling requests until the run is done.

    Args:
        state: The run after `ursa.coordinator.methods.flicker.algorithm.start`.
        reply_deadline_s: Time each request gets.
        now: The current time (opens the first request).
    """

    def __init__(self, state: fl.FlickerState, reply_deadline_s: float, now: float):
        self.state = state
        self.reply_deadline_s = reply_deadline_s
        self.step = 0
        self.request: Request | None = None
        self.log: list[dict[str, Any]] = []
        self._open(now)

    def to_record(self) -> dict[str, Any]:
        """A JSON-able record of the loop (the open request included)."""
        request = self.request
        return {
            "state": self.state.to_dict(),
            "reply_deadline_s": self.reply_deadline_s,
            "step": self.step,
            "log": self.log,
            "request": None
            if request is None
            else {
                "kind": request.kind,
                "step": request.step,
                "targets": sorted(request.targets),
                "similarities": request.similarities,
                "answered": sorted(request.answered),
            },
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any], now: float) -> CorrectionLoop:
        """Rebuild from `to_record`; the open request gets a fresh deadline.

        Raises:
            KeyError, TypeError, ValueError: a damaged record.
        """
        loop = cls.__new__(cls)
        loop.state = fl.FlickerState.from_dict(record["state"])
        loop.reply_deadline_s = float(record["reply_deadline_s"])
        loop.step = int(record["step"])
        loop.log = list(record["log"])
        raw = record["request"]
        loop.request = None
        if raw is not None:
            kind: RequestKind = "cosine" if raw["kind"] == "cosine" else "resample"
            loop.request = Request(
                kind,
                int(raw["step"]),
                frozenset(str(d) for d in raw["targets"]),
                now + loop.reply_deadline_s,
                {str(d): float(c) for d, c in raw["similarities"].items()},
                {str(d) for d in raw["answered"]},
            )
        return loop

    @property
    def is_over(self) -> bool:
        """Whether the run ended."""
        return self.request is None

    def _open(self, now: float) -> None:
        state = self.state
        if state.stage is fl.CorrectionStage.DONE:
            self.request = None
            return
        self.step += 1
        deadline = now + self.reply_deadline_s
        if state.stage is fl.CorrectionStage.LOCALISE:
            targets = frozenset(fl.localisation_candidates(state))
            self.request = Request("cosine", self.step, targets, deadline)
            return
        if state.dominant is None:  # unreachable: RESAMPLE always names one
            raise fl.FlickerError("stage RESAMPLE without a dominant device")
        self.request = Request(
            "resample", self.step, frozenset({state.dominant}), deadline
        )

    def check_reply(self, kind: RequestKind, sender: str, step: int) -> Request:
        """Return the open request a reply answers.

        Raises:
            LoopError: no such open request (late), not asked, or answered twice.
        """
        request = self.request
        if request is None or request.kind != kind or request.step != step:
            raise LoopError(ErrorCode.LATE, f"no open {kind} request at step {step}")
        if sender not in request.targets:
            raise LoopError(ErrorCode.UNAUTHORISED, f"{sender} was not asked")
        if sender in request.answered:
            raise LoopError(ErrorCode.MALFORMED, "a second reply to this request")
        return request

    def extend_deadline(self, step: int, deadline_at: float) -> None:
        """Give the open request of ``step`` until ``deadline_at`` (never less)."""
        request = self.request
        if request is not None and request.step == step:
            request.deadline_at = max(request.deadline_at, deadline_at)

    def postpone(self, seconds: float) -> None:
        """Move the open request's deadline ``seconds`` later (an outage's time)."""
        if self.request is not None:
            self.request.deadline_at += seconds

    def on_cosine(self, sender: str, step: int, cosine: float, now: float) -> bool:
        """Record a decrypted cosine; True if a new request was opened."""
        request = self.check_reply("cosine", sender, step)
        request.similarities[sender] = cosine
        request.answered.add(sender)
        if request.answered >= request.targets:
            self._localised(request, now)
            return True
        return False

    def on_update(
        self,
        sender: str,
        step: int,
        global_counts: npt.ArrayLike | None,
        saturated: bool,
        now: float,
    ) -> bool:
        """Record the dominant device's update (None: counts unchanged); True."""
        request = self.check_reply("resample", sender, step)
        request.answered.add(sender)
        self._updated(global_counts, saturated, now, silent=False)
        return True

    def on_deadline(self, now: float) -> bool:
        """Close an overdue request with what it got; True if one was closed."""
        request = self.request
        if request is None or now < request.deadline_at:
            return False
        if request.kind == "cosine":
            self._localised(request, now)
        else:
            self._updated(None, True, now, silent=True)
        return True

    def _localised(self, request: Request, now: float) -> None:
        self.state = fl.on_similarities(self.state, request.similarities)
        cosines: Mapping[str, float] = request.similarities
        entry = {d: round(c, 6) for d, c in sorted(cosines.items())}
        self.log.append(
            {
                "localise": entry,
                "dominant": self.state.dominant,
                "silent": list(request.missing),
            }
        )
        self._open(now)

    def _updated(
        self,
        global_counts: npt.ArrayLike | None,
        saturated: bool,
        now: float,
        *,
        silent: bool,
    ) -> None:
        dominant = self.state.dominant
        self.state = fl.on_update(self.state, global_counts, saturated=saturated)
        self.log.append(
            {
                "device": dominant,
                "update": global_counts is not None,
                "saturated": saturated,
                "silent": silent,
                "gi": round(self.state.gi, 6),
            }
        )
        self._open(now)
