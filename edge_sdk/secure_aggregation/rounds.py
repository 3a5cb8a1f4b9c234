"""A device's side of secure aggregation, round by round (the runtime adapter).

`MaskingRounds` is a component the device's training steps own: it answers
the coordinator's secure-aggregation messages with a fresh
`MaskingParticipant` per round, and turns a trained delta into the round's
masked vector. Only what the device itself checked leaves it:

* ``SecAggSetup`` and ``SecAggUnmask`` must carry the pinned coordinator's
  signature (they bound what the device adds and what it reveals);
* peers' keys must carry the peer's own signature (checked by the
  participant against the enrolled identity the roster names);
* a round's masks are used once, and a device never reveals both shares of
  one peer (the participant refuses).

What the device adds is bounded by the signed setup: its delta is clipped to
``clip_norm``, its weight to ``max_examples``, the vector's fixed point keeps
every honest sum inside the ring; under distributed DP it adds its share of
discrete Gaussian noise before masking. The secrets of a round live only in
memory: a device restarted mid-round has none, answers nothing for that
round (the coordinator recovers its masks from the others' shares, or the
round is abandoned) and so never reuses a mask.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.discrete_gaussian import sample_discrete_gaussian
from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.fixed_point import VectorLayout
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.vector_norm import l2_norm
from ursa.edge_sdk.secure_aggregation.participant import (
    MaskingParticipant,
    PeerAdvert,
    SecAggError,
)
from ursa.models.weights import flatten
from ursa.protocol.messages import (
    BaseMessage,
    DeviceKeys,
    ErrorCode,
    ErrorReply,
    RevealedShare,
    SecAggKeys,
    SecAggRoster,
    SecAggSetup,
    SecAggShareBundle,
    SecAggShares,
    SecAggUnmask,
    SecAggUnmaskShares,
    ShareBox,
)
from ursa.protocol.secure_aggregation import (
    METRIC_SLOTS,
    MODEL_SEGMENT,
    WEIGHT_SEGMENT,
    contribution_layout,
    float_names,
    noise_sigmas,
)

__all__ = [
    "Contribution",
    "EncodedContribution",
    "MaskingRounds",
    "clipped_delta",
    "encode_contribution",
    "peer_adverts",
]

logger = logging.getLogger("ursa.edge_sdk")

KEPT_ROUNDS = 4
"""Rounds whose secrets and answers a device keeps (a re-sent request of an
older round gets no answer)."""

Send = Callable[[BaseMessage], None]
Verify = Callable[[BaseMessage], None]
MessageId = Callable[[str, int], str]
PeerIdentity = Callable[[DeviceKeys], DevicePublicIdentity]
"""A roster entry's identity, checked against its operator certificate."""


@dataclass(frozen=True)
class Contribution:
    """What a device puts into a round's secure sum (before clipping)."""

    delta: Mapping[str, NDArray[Any]]
    """``local - global`` (already scaled by a method, e.g. CLIMB's w_i)."""
    num_examples: int
    loss: float = 0.0
    train_s: float = 0.0
    names: tuple[str, ...] | None = None
    """The global model's float arrays, in order (None: the delta's own): what
    the coordinator's layout counts, whatever dtype a trainer gives a counter."""


@dataclass
class _Round:
    setup: SecAggSetup
    participant: MaskingParticipant
    answers: dict[str, BaseMessage] = field(default_factory=dict)
    """The message sent at each step (a re-sent request gets the same one)."""
    ready: bool = False
    """The share bundle arrived: the round may train."""


class MaskingRounds:
    """The device's secure-aggregation rounds (see the module docstring).

    Args:
        identity: The device's identity (signs its per-round keys).
        federation: The federation's name.
        send: Queues a message on the device's up topic.
        verify_coordinator: Checks the pinned coordinator's signature.
        message_id: ``message_id(step, round)``: stable ids, so a re-sent
            answer is the same message.
        peer_identity: A roster peer's identity, operator-certified (the
            device's trust anchor); raises `UntrustedIdentityError` otherwise.
        rng: Rounding and DP noise; by default fresh from the OS. Not the
            device's seeded generator: a coordinator that knew that seed could
            subtract the noise, and drawing from it would shift the device's
            other (seeded) draws.
    """

    def __init__(
        self,
        *,
        identity: DeviceIdentity,
        federation: str,
        send: Send,
        verify_coordinator: Verify,
        message_id: MessageId,
        peer_identity: PeerIdentity,
        rng: np.random.Generator | None = None,
    ) -> None:
        self._identity = identity
        self._federation = federation
        self._send = send
        self._verify = verify_coordinator
        self._message_id = message_id
        self._peer_identity = peer_identity
        self._rng = rng if rng is not None else np.random.default_rng()
        self._rounds: OrderedDict[int, _Round] = OrderedDict()

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self._identity.device_id

    def ready(self, round_index: int, model: str, version: int) -> bool:
        """Whether the round's shares arrived for this model version."""
        work = self._rounds.get(round_index)
        return (
            work is not None
            and work.ready
            and work.setup.model == model
            and work.setup.model_version == version
        )

    def knows(self, round_index: int) -> bool:
        """Whether this device takes part in the round's secure sum (so far)."""
        return round_index in self._rounds

    # --- messages -------------------------------------------------------------

    def on_setup(self, message: SecAggSetup) -> None:
        """Give this round's signed keys (again, the same, if asked again)."""
        if self.device_id not in message.participants:
            return
        self._verify(message)  # CryptoError / NotReadyError: refused upstream
        work = self._rounds.get(message.round)
        if work is not None and work.setup.model_version == message.model_version:
            self._resend(work, "keys")
            return
        participant = MaskingParticipant(
            identity=self._identity,
            federation=self._federation,
            run=message.run,
            round_index=message.round,
            threshold=message.threshold,
            degree=message.degree,
        )
        work = _Round(message, participant)
        self._rounds[message.round] = work
        while len(self._rounds) > KEPT_ROUNDS:
            self._rounds.popitem(last=False)
        advert = participant.advertise()
        self._answer(
            work,
            "keys",
            SecAggKeys(
                **self._head(work, "secagg-keys"),
                c_public=advert.c_public,
                s_public=advert.s_public,
                advert_signature=advert.signature,
            ),
        )

    def on_roster(self, message: SecAggRoster) -> None:
        """Seal a share pair to each neighbour on the roster."""
        work = self._current(message.round, message.model_version)
        if work is None or self._resend(work, "shares"):
            return
        try:
            peers = peer_adverts(message, self._peer_identity)
            boxes = work.participant.share(peers, message.participants)
        except (SecAggError, CryptoError, ValueError) as exc:
            self._refuse(work, "roster", exc)
            return
        self._answer(
            work,
            "shares",
            SecAggShares(
                **self._head(work, "secagg-shares"),
                boxes=tuple(ShareBox(peer=p, box=b) for p, b in boxes),
            ),
        )

    def on_bundle(self, message: SecAggShareBundle) -> bool:
        """Open the neighbours' boxes; True once the round may train."""
        work = self._current(message.round, message.model_version)
        if work is None:
            return False
        if work.ready:
            return True
        try:
            work.participant.receive_shares([(b.peer, b.box) for b in message.boxes])
        except (SecAggError, CryptoError, ValueError) as exc:
            self._refuse(work, "share bundle", exc)
            return False
        work.ready = True
        return True

    def on_unmask(self, message: SecAggUnmask) -> None:
        """Reveal the shares the signed survivor list asks for (never both of one)."""
        if self.device_id not in message.survivors:
            return
        work = self._current(message.round, message.model_version)
        if work is None:
            return
        self._verify(message)
        if self._resend(work, "unmask"):
            return
        try:
            revealed = work.participant.unmask(message.survivors, message.dropped)
        except (SecAggError, CryptoError, ValueError) as exc:
            self._refuse(work, "survivor list", exc)
            return
        shares = tuple(
            RevealedShare(
                owner=r.owner, secret=r.kind, index=r.share.index, data=r.share.data
            )
            for r in revealed
        )
        self._answer(
            work,
            "unmask",
            SecAggUnmaskShares(
                **self._head(work, "secagg-unmask"),
                shares=shares,
            ),
        )

    # --- the masked vector --------------------------------------------------------

    def masked_vector(self, round_index: int, contribution: Contribution) -> bytes:
        """The round's masked contribution as it travels (little-endian uint32).

        Raises:
            SecAggError: the round has no shares yet, its mask was used, or the
                delta is not finite.
        """
        work = self._rounds.get(round_index)
        if work is None or not work.ready:
            raise SecAggError(f"round {round_index} has no secure-aggregation keys")
        setup = work.setup
        encoded = encode_contribution(setup, contribution, self._rng)
        if encoded.norm > setup.clip_norm:
            logger.info(
                "%s: round %d: delta norm %.3g clipped to %.3g",
                self.device_id,
                round_index,
                encoded.norm,
                setup.clip_norm,
            )
        return encoded.layout.to_bytes(work.participant.mask(encoded.vector))

    # --- helpers ------------------------------------------------------------------

    def _current(self, round_index: int, version: int) -> _Round | None:
        work = self._rounds.get(round_index)
        if work is None or work.setup.model_version != version:
            return None
        return work

    def _head(self, work: _Round, step: str) -> dict[str, Any]:
        """The fields every answer of the round shares (a stable id per step)."""
        setup = work.setup
        return {
            "federation": self._federation,
            "round": setup.round,
            "sender": self.device_id,
            "message_id": self._message_id(step, setup.round),
            "model": setup.model,
            "model_version": setup.model_version,
        }

    def _answer(self, work: _Round, step: str, message: BaseMessage) -> None:
        work.answers[step] = message
        self._send(message)

    def _resend(self, work: _Round, step: str) -> bool:
        sent = work.answers.get(step)
        if sent is not None:
            self._send(sent)
        return sent is not None

    def _refuse(self, work: _Round, what: str, exc: Exception) -> None:
        """Sit the round out and say why (no secret in the reason)."""
        logger.error(
            "%s: round %d: secure aggregation refused the %s: %s",
            self.device_id,
            work.setup.round,
            what,
            exc,
        )
        reply = ErrorReply(
            federation=self._federation,
            round=work.setup.round,
            sender=self.device_id,
            message_id=self._message_id("secagg-refused", work.setup.round),
            code=(
                ErrorCode.UNTRUSTED_IDENTITY
                if isinstance(exc, UntrustedIdentityError)
                else ErrorCode.SECURE_AGGREGATION_FAILED
            ),
            reason=f"refused the {what}: {exc}"[:256],
        )
        self._answer(work, "refused", reply)


def clipped_delta(
    delta: Mapping[str, NDArray[Any]],
    clip_norm: float,
    names: Sequence[str] | None = None,
) -> tuple[NDArray[np.float64], float]:
    """The delta's float arrays as one vector clipped to ``clip_norm``, and its norm.

    ``names``: the arrays to take, in order (None: the delta's float arrays).

    Raises:
        SecAggError: the delta holds NaN or inf, or lacks one of ``names``.
    """
    wanted = float_names(delta) if names is None else names
    missing = [name for name in wanted if name not in delta]
    if missing:
        raise SecAggError(f"the delta lacks the model's {missing[:3]}")
    floats = {name: delta[name] for name in wanted}
    flat = flatten(floats)[0].astype(np.float64)
    norm = l2_norm(flat)  # not np.linalg.norm: see `ursa.crypto.vector_norm`
    if not math.isfinite(norm):
        raise SecAggError("the delta holds NaN or inf")
    return (flat * (clip_norm / norm) if norm > clip_norm else flat), norm


class EncodedContribution(NamedTuple):
    """A device's unmasked ring vector, its layout, and the delta's norm."""

    vector: NDArray[np.uint32]
    layout: VectorLayout
    norm: float
    """Before clipping (above ``clip_norm``: the delta was clipped)."""


def encode_contribution(
    setup: SecAggSetup, contribution: Contribution, rng: np.random.Generator
) -> EncodedContribution:
    """A device's unmasked ring vector for the round (see `EncodedContribution`).

    Clipped to ``clip_norm``, weighted by the signed weighting (FedAvg's weight
    capped at ``max_examples``), encoded in the round's layout and, under DP,
    with this device's share of the noise: what the mask then hides.
    """
    flat, norm = clipped_delta(contribution.delta, setup.clip_norm, contribution.names)
    weight = (
        float(min(contribution.num_examples, setup.max_examples))
        if setup.weighting == "fedavg"
        else 1.0
    )
    parts: dict[str, NDArray[np.float64]] = {
        MODEL_SEGMENT: weight * flat,
        WEIGHT_SEGMENT: np.array([weight]),
    }
    layout = contribution_layout(setup, flat.size)
    if any(segment.name == METRIC_SLOTS[0] for segment in layout.segments):
        parts["loss"] = np.array([_finite(contribution.loss)])
        parts["train_s"] = np.array([_finite(contribution.train_s)])
        parts["samples"] = np.array([float(contribution.num_examples)])
        parts["reporting"] = np.array([1.0])
    vector = layout.encode(parts, rng)
    if setup.noise_multiplier > 0:
        vector = _with_noise(vector, setup, layout, rng)
    return EncodedContribution(vector, layout, norm)


def peer_adverts(roster: SecAggRoster, peer_identity: PeerIdentity) -> list[PeerAdvert]:
    """The roster's neighbours as the participant checks them.

    Raises:
        UntrustedIdentityError: ``peer_identity`` refused a neighbour's keys.
    """
    return [
        PeerAdvert(
            identity=peer_identity(peer.identity),
            c_public=peer.c_public,
            s_public=peer.s_public,
            signature=peer.advert_signature,
        )
        for peer in roster.peers
    ]


def _with_noise(
    vector: NDArray[np.uint32],
    setup: SecAggSetup,
    layout: VectorLayout,
    rng: np.random.Generator,
) -> NDArray[np.uint32]:
    """This device's share of the round's discrete Gaussian noise, in the ring."""
    sigmas = noise_sigmas(setup, layout)
    noise = np.concatenate(
        [
            sample_discrete_gaussian(sigmas[segment.name], segment.length, rng)
            for segment in layout.segments
        ]
    )
    return (vector + noise.astype(np.uint32)).astype(np.uint32)


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else 0.0
