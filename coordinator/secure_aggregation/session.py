"""A round's secure aggregation on the coordinator: keys, shares, masked sum, unmask.

`SecureAggregation` is one component the training plugin is handed (not a
base class of it). It is the round's last before-training step (SA1 keys and
SA2 shares, two `Gather` s), then holds the running masked sum of the round
(`MaskedSum`, a file checkpointed after every accepted vector, like the plain
running sum), then runs SA3 (the unmask `Gather` over the survivors) and
returns the exact integer sum of the survivors' contributions::

    step.open(info)            SA1: SecAggSetup -> SecAggKeys   (gather U0 -> U1)
                               SA2: SecAggRoster -> SecAggShares (gather U1 -> U2)
    expected(round)            U2: whose masked vector the round waits for
    add(round, device, bytes)  one masked vector into the sum (U3 grows)
    begin_unmask(round, now)   SA3: SecAggUnmask -> SecAggUnmaskShares (U3)
    unmasked(round)            the decoded sum, once SA3 closed (or why not)

Every phase is a record in the coordinator's store, saved in the transaction
of the message that changed it; `open` for the same round after a restart
resumes whichever phase was running (fresh deadline, its request or result
sent again), and the masked sum file says who is in it, so no vector counts
twice. Fewer than ``threshold`` devices at any step: the round is abandoned
(the model stays at its version) with one log line that says why.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.before_training import (
    BeforeTraining,
    RoundInfo,
    StepContext,
    StepPhase,
)
from ursa.coordinator.gather import Gather, save_gather
from ursa.coordinator.model_store import write_atomic
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.secure_aggregation.folds import (
    Advert,
    BoxState,
    KeysFold,
    RoundHead,
    SharesFold,
    ShareState,
    UnmaskFold,
)
from ursa.coordinator.secure_aggregation.masked_sum import MaskedSum
from ursa.coordinator.secure_aggregation.privacy import (
    AccountantUnavailableError,
    PrivacyLedger,
    require_accountant,
)
from ursa.coordinator.secure_aggregation.sum_bounds import (
    CheckedSum,
    SumBounds,
    SumOutOfBoundsError,
)
from ursa.coordinator.secure_aggregation.unmasking import (
    UnmaskError,
    add_masked,
    unmask_sum,
)
from ursa.crypto.fixed_point import LayoutError, VectorLayout
from ursa.crypto.neighbour_graph import sparse_degree
from ursa.crypto.shamir import Share, UnmaskShare
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import (
    COORDINATOR,
    ErrorCode,
    SecAggKeys,
    SecAggSetup,
    SecAggShares,
    SecAggUnmask,
    SecAggUnmaskShares,
)
from ursa.protocol.router import RejectedError, Router
from ursa.protocol.secure_aggregation import (
    MODEL_SEGMENT,
    contribution_layout,
    noise_sigmas,
)

__all__ = ["MaskedSum", "SecureAggregation", "Unmasked", "check_accountant"]

logger = logging.getLogger("ursa.coordinator.secure_aggregation")

WeightingName = Callable[[], str]


@dataclass(frozen=True)
class Unmasked:
    """What SA3 gave: the decoded, checked sum by segment, or why there is none."""

    sums: Mapping[str, NDArray[np.float64]] | None
    survivors: tuple[str, ...]
    why: str = ""
    checked: CheckedSum | None = None
    """The sum's bounds check (`SumBounds`): its weight to divide by."""
    out_of_bounds: bool = False
    """The survivors' sum was unmasked but no honest devices could give it."""


class _Round:
    """One round's phases (the plugin keeps one round open at a time)."""

    def __init__(self, info: RoundInfo, head: RoundHead, keys: KeysFold) -> None:
        self.info = info
        self.head = head
        self.keys_fold = keys
        self.keys: Gather[SecAggKeys, dict[str, Advert]] | None = None
        self.shares: Gather[SecAggShares, BoxState] | None = None
        self.unmask: Gather[SecAggUnmaskShares, ShareState] | None = None
        self.graph: dict[str, tuple[str, ...]] = {}
        self.masked: MaskedSum | None = None
        self.abandoned: str | None = None
        self.layout: VectorLayout | None = None
        self.spent: dict[str, float] = {}
        """The privacy ledger's figures once the round released a noised sum."""
        self.out_of_bounds: str | None = None
        """Why the unmasked sum failed its bounds check (None: it passed)."""

    @property
    def setup(self) -> SecAggSetup:
        return self.keys_fold.setup


class SecureAggregation(BeforeTraining):
    """Secure aggregation of one model's rounds (see the module docstring).

    Args:
        ctx: The training plugin's context.
        config: ``[aggregation]``.
        model: The model whose rounds it sums (its records are named by it).
        state_dir: Where the masked running sum is checkpointed.
        weighting: The round's weighting, read when a round opens (a CLIMB
            step may set it).
        max_examples: FedAvg's weight cap (signed into each round's setup).
    """

    name = "secure_aggregation"
    signed = False

    def __init__(
        self,
        ctx: StepContext,
        config: AggregationConfig,
        *,
        model: str,
        state_dir: Path,
        weighting: WeightingName,
    ) -> None:
        super().__init__(ctx)
        check_accountant(config)
        self._config = config
        self._model = model
        self._dir = Path(state_dir) / "secure_aggregation" / model
        self._weighting = weighting
        self._round: _Round | None = None

    @property
    def config(self) -> AggregationConfig:
        """``[aggregation]``."""
        return self._config

    # --- BeforeTraining -------------------------------------------------------

    def register(self, router: Router) -> None:
        """Keys and shares are this step's; the unmask shares come via the plugin."""
        router.register(SecAggKeys, self._on_keys, owner=self.name)
        router.register(SecAggShares, self._on_shares, owner=self.name)
        router.register(SecAggUnmaskShares, self._on_unmask_shares, owner=self.name)

    def open(self, info: RoundInfo, now: float) -> StepPhase | None:
        """SA1 and SA2 of the round: resumed from the store, else asked anew."""
        ctx = self.ctx
        self._round = None
        selected = tuple(sorted(info.selected))
        threshold = self._config.threshold_for(len(selected))
        setup = ctx.view.sign(
            SecAggSetup(
                federation=ctx.federation,
                round=info.round,
                sender=COORDINATOR,
                model=info.model,
                model_version=info.version,
                participants=selected,
                threshold=min(threshold, len(selected)),
                degree=max(1, sparse_degree(len(selected), self._config.sparse_above)),
                weighting=self._weighting(),  # type: ignore[arg-type]
                max_examples=self._config.max_examples,
                clip_norm=self._config.clip_norm,
                noise_multiplier=self._config.noise_multiplier,
                metrics=self._config.noise_multiplier == 0.0,
            )
        )
        head = RoundHead(
            ctx.federation,
            setup.run,
            info.round,
            info.model,
            info.version,
        )
        work = _Round(
            info,
            head,
            KeysFold(
                head,
                setup,
                ctx.view.device_identity,
                ctx.view.device_certificate,
            ),
        )
        self._round = work
        if threshold > len(selected):
            work.abandoned = (
                f"{len(selected)} devices selected, secure aggregation needs at "
                f"least {threshold}"
            )
            return None
        self._resume_or_open(work, now)
        return work.shares if work.shares is not None else work.keys

    def on_tick(self, round_index: int, now: float) -> None:
        """Follow last wills; close the open gather at its deadline."""
        work = self._work(round_index)
        if work is None:
            return
        send = self.ctx.send
        for gather in (work.keys, work.shares, work.unmask):
            if gather is not None and gather.is_open:
                gather.track_online(self.ctx.view.online_devices(), send)
                gather.poll(now, send)
                if not gather.is_open:  # no write on a quiet tick
                    self._changed(work, gather)

    def is_done(self, round_index: int) -> bool:
        """SA2 closed (or the round was abandoned): training may start."""
        work = self._work(round_index)
        if work is None or work.abandoned is not None:
            return True
        return work.shares is not None and not work.shares.is_open

    def republish(self, round_index: int) -> None:
        """Send again what devices wait on in the running gather."""
        work = self._work(round_index)
        if work is None:
            return
        for gather in (work.keys, work.shares, work.unmask):
            if gather is not None:
                gather.republish(self.ctx.send)

    def extend_deadlines(self, seconds: float) -> None:
        """The open gathers wait ``seconds`` longer (the broker was away)."""
        work = self._round
        if work is None:
            return
        for gather in (work.keys, work.shares, work.unmask):
            if gather is not None:
                gather.extend(seconds)

    def close(self, round_index: int) -> None:
        """Drop the round's records and its masked sum."""
        work = self._work(round_index)
        if work is None:
            return
        for key in self._keys(work.info):
            self.ctx.view.store.drop_phase(key)
        self._masked_path(round_index).unlink(missing_ok=True)
        self._round = None

    def metrics(self, round_index: int) -> Mapping[str, Any]:
        """How many devices each step kept (U1, U2, U3), for the round's record."""
        work = self._work(round_index)
        if work is None:
            return {}
        figures: dict[str, Any] = {"threshold": work.setup.threshold}
        if work.keys is not None:
            figures["keys"] = len(work.keys.answered)
        if work.shares is not None:
            figures["shares"] = len(work.shares.answered)
        if work.masked is not None:
            figures["masked"] = len(work.masked.contributors)
        if work.unmask is not None:
            figures["unmasked_by"] = len(work.unmask.answered)
        if work.abandoned is not None:
            figures["abandoned"] = work.abandoned
        if work.out_of_bounds is not None:
            figures["out_of_bounds"] = work.out_of_bounds
        out: dict[str, Any] = {"secure_aggregation": figures}
        if work.spent:
            out["privacy"] = dict(work.spent)
        return out

    # --- what the training plugin asks --------------------------------------------

    def abandoned(self, round_index: int) -> str | None:
        """Why the round cannot sum securely (None: it can, so far)."""
        work = self._work(round_index)
        return None if work is None else work.abandoned

    def expected(self, round_index: int) -> frozenset[str]:
        """U2: the devices whose masked vector the round may take."""
        work = self._work(round_index)
        if work is None or work.shares is None or work.abandoned is not None:
            return frozenset()
        return frozenset(work.shares.answered)

    def contributors(self, round_index: int) -> frozenset[str]:
        """U3 so far: the devices whose masked vector is in the sum."""
        work = self._work(round_index)
        if work is None or work.masked is None:
            return frozenset()
        return frozenset(work.masked.contributors)

    def layout(self, round_index: int, model_values: int) -> VectorLayout:
        """The round's vector layout for a model of ``model_values`` float values."""
        work = self._work(round_index)
        assert work is not None
        if work.layout is None:
            work.layout = contribution_layout(work.setup, model_values)
        return work.layout

    def add(self, round_index: int, device: str, payload: bytes, values: int) -> bool:
        """Add one masked vector to the round's sum; False for a repeat.

        Raises:
            RejectedError: not in U2, or not a vector of the round's layout.
        """
        work = self._work(round_index)
        if work is None or work.abandoned is not None:
            raise RejectedError(ErrorCode.LATE, f"round {round_index} sums nothing")
        if device not in self.expected(round_index):
            raise RejectedError(
                ErrorCode.UNAUTHORISED, "did not share keys in this round's sum"
            )
        if work.unmask is not None:
            raise RejectedError(ErrorCode.LATE, "the round is unmasking")
        layout = self.layout(round_index, values)
        try:
            vector = layout.from_bytes(payload)
        except LayoutError as exc:
            raise RejectedError(ErrorCode.MALFORMED, f"masked vector: {exc}") from None
        masked = work.masked
        if masked is None:
            masked = MaskedSum(
                round_index, work.info.version, np.zeros(layout.length, np.uint32)
            )
        if device in masked.contributors:
            return False
        masked.total = add_masked(masked.total, vector)
        masked.contributors.add(device)
        work.masked = masked
        write_atomic(self._masked_path(round_index), masked.to_bytes())
        return True

    def begin_unmask(self, round_index: int, now: float) -> None:
        """SA3: ask the survivors for their shares (or abandon below threshold)."""
        work = self._work(round_index)
        ctx = self.ctx
        if work is None or work.abandoned is not None or work.unmask is not None:
            return
        survivors = tuple(sorted(self.contributors(round_index)))
        threshold = work.setup.threshold
        if len(survivors) < threshold:
            work.abandoned = (
                f"{len(survivors)} masked vectors arrived, the threshold is {threshold}"
            )
            return
        dropped = tuple(sorted(self.expected(round_index) - set(survivors)))
        request = ctx.view.sign(
            SecAggUnmask(
                federation=ctx.federation,
                round=round_index,
                sender=COORDINATOR,
                model=work.info.model,
                model_version=work.info.version,
                survivors=survivors,
                dropped=dropped,
            )
        )
        fold = UnmaskFold(work.head, request, work.graph)
        work.unmask = Gather.open(
            self._keys(work.info)[2],
            fold,
            expected=survivors,
            online=ctx.view.online_devices(),
            now=now,
            timeout_s=self._config.unmask_timeout_s,
            send=ctx.send,
            min_replies=threshold,
        )
        self._changed(work, work.unmask)

    def unmasking(self, round_index: int) -> bool:
        """Whether SA3 is open (the round waits for it)."""
        work = self._work(round_index)
        return work is not None and work.unmask is not None and work.unmask.is_open

    def unmasked(self, round_index: int, model_values: int) -> Unmasked:
        """The decoded sum of the survivors, checked, or why there is none.

        Call once SA3 closed (or the round was abandoned); ``model_values``:
        the model's float values (the layout of a sum resumed from its file).
        A sum outside what the survivors could give honestly (`SumBounds`) is
        not returned: ``out_of_bounds`` and ``why`` say so.
        """
        work = self._work(round_index)
        if work is None:
            return Unmasked(None, (), "no secure aggregation in this round")
        survivors = tuple(sorted(self.contributors(round_index)))
        if work.abandoned is not None:
            return Unmasked(None, survivors, work.abandoned)
        gather = work.unmask
        if gather is None or work.masked is None:
            return Unmasked(None, survivors, "no masked vector arrived")
        layout = self.layout(round_index, model_values)
        if gather.status is not PhaseStatus.DONE:
            return Unmasked(
                None,
                survivors,
                f"{len(gather.answered)} of {len(survivors)} survivors sent their "
                f"shares, the threshold is {work.setup.threshold}",
            )
        adverts = work.keys.state if work.keys is not None else {}
        shares = {
            owner: [
                UnmaskShare(owner, s.secret, Share(s.index, s.data)) for _, s in got
            ]
            for owner, got in gather.state.items()
        }
        dropped = _unmask_of(gather).dropped
        head = work.head
        try:
            total = unmask_sum(
                work.masked.total,
                federation=head.federation,
                run=head.run,
                round_index=head.round,
                participants=sorted(adverts),
                adverts={
                    d: adverts[d].s_public
                    for d in (*survivors, *dropped)
                    if d in adverts
                },
                survivors=survivors,
                dropped=dropped,
                shares=shares,
                threshold=work.setup.threshold,
                degree=work.setup.degree,
            )
        except (UnmaskError, ValueError) as exc:
            return Unmasked(None, survivors, f"unmasking failed: {exc}")
        sums = layout.decode(total)
        self._spend_privacy(work)  # decoded: released, whatever it holds
        try:
            checked = SumBounds.of(work.setup, layout, len(survivors)).check(sums)
        except SumOutOfBoundsError as exc:
            work.out_of_bounds = str(exc)
            return Unmasked(
                None, survivors, f"the sum is out of bounds: {exc}", out_of_bounds=True
            )
        return Unmasked(sums, survivors, checked=checked)

    def _spend_privacy(self, work: _Round) -> None:
        """Record a released noised sum in the privacy ledger (DP only), and log it."""
        setup = work.setup
        if setup.noise_multiplier == 0 or work.layout is None or work.spent:
            return
        ctx = self.ctx
        key = f"secagg.privacy.{self._model}"
        saved = ctx.view.store.get_meta(key)
        ledger = None
        if saved is not None:
            try:
                ledger = PrivacyLedger.from_dict(json.loads(saved))
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("%s is unusable (%s): a new ledger", key, exc)
        if ledger is None:
            sigma = noise_sigmas(setup, work.layout)[MODEL_SEGMENT]
            ledger = PrivacyLedger(
                noise_multiplier=setup.noise_multiplier,
                delta=self._config.delta,
                parties=setup.threshold,
                dimension=work.layout.length,
                sigma_int=sigma,
            )
        if work.info.round in ledger.rounds_recorded:
            spent = ledger.spent
        else:
            spent = ledger.record_round(work.info.round)
            ctx.view.store.set_meta(key, json.dumps(ledger.to_dict()))
        work.spent = {
            "epsilon_round": spent.round_epsilon,
            "epsilon_total": spent.total_epsilon,
            "delta": spent.delta,
            "rounds": spent.rounds,
        }
        logger.info(
            "round %d: privacy spent epsilon %.3f this round, %.3f in %d rounds "
            "(delta %g)",
            work.info.round,
            spent.round_epsilon,
            spent.total_epsilon,
            spent.rounds,
            spent.delta,
        )

    # --- messages -------------------------------------------------------------------

    def _on_keys(self, message: SecAggKeys) -> None:
        work = self._open_gather(message.round, "keys")
        assert work.keys is not None
        self._offer(work, work.keys, message)

    def _on_shares(self, message: SecAggShares) -> None:
        work = self._open_gather(message.round, "shares")
        assert work.shares is not None
        self._offer(work, work.shares, message)

    def _on_unmask_shares(self, message: SecAggUnmaskShares) -> None:
        work = self._open_gather(message.round, "unmask")
        assert work.unmask is not None
        self._offer(work, work.unmask, message)

    def _offer(self, work: _Round, gather: Gather[Any, Any], message: Any) -> None:
        ctx = self.ctx
        gather.offer(message.sender, message, ctx.send)
        self._changed(work, gather, message.sender)

    def _open_gather(self, round_index: int, which: str) -> _Round:
        work = self._work(round_index)
        gather = None if work is None else getattr(work, which)
        if work is None or gather is None or not gather.is_open:
            raise RejectedError(
                ErrorCode.LATE,
                f"round {round_index} takes no secure-aggregation {which}",
            )
        return work

    # --- phases -----------------------------------------------------------------------

    def _keys(self, info: RoundInfo) -> tuple[str, str, str]:
        base = f"secagg/{info.model}/{info.round}"
        return (f"{base}/keys", f"{base}/shares", f"{base}/unmask")

    def _resume_or_open(self, work: _Round, now: float) -> None:
        ctx = self.ctx
        store = ctx.view.store
        keys_key, _, unmask_key = self._keys(work.info)
        saved = store.phase(keys_key)
        if saved is not None:
            try:
                work.keys = Gather.from_record(saved, work.keys_fold)
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("%s unusable (%s); asking again", keys_key, exc)
        if work.keys is None:
            logger.info(
                "round %d: secure aggregation asks %d devices for keys "
                "(threshold %d, %d neighbours each)",
                work.info.round,
                len(work.info.selected),
                work.setup.threshold,
                work.setup.degree,
            )
            work.keys = Gather.open(
                keys_key,
                work.keys_fold,
                expected=work.info.selected,
                online=ctx.view.online_devices(),
                now=now,
                timeout_s=self._config.keys_timeout_s,
                send=ctx.send,
                min_replies=work.setup.threshold,
            )
            self._changed(work, work.keys)
            return
        if work.keys.is_open:
            work.keys.restarted(now, ctx.send)
            return
        self._after_keys(work, now, resume=True)
        self._resume_masked(work)
        saved = store.phase(unmask_key)
        if saved is not None and work.shares is not None and not work.shares.is_open:
            try:
                request = _load_unmask_request(saved["request"])
                fold = UnmaskFold(work.head, request, work.graph)
                work.unmask = Gather.from_record(saved["gather"], fold)
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("%s unusable (%s); asking again", unmask_key, exc)
            else:
                work.unmask.restarted(now, ctx.send)

    def _after_keys(self, work: _Round, now: float, *, resume: bool = False) -> None:
        """SA1 closed: abandon below threshold, else open (or resume) SA2."""
        ctx = self.ctx
        keys = work.keys
        assert keys is not None
        if keys.status is not PhaseStatus.DONE:
            work.abandoned = (
                f"{len(keys.answered)} of {len(work.info.selected)} selected devices "
                f"gave keys, the threshold is {work.setup.threshold}"
            )
            return
        work.graph = work.keys_fold.graph(keys.state)
        fold = SharesFold(work.head, work.keys_fold.rosters(keys.state))
        shares_key = self._keys(work.info)[1]
        saved = ctx.view.store.phase(shares_key) if resume else None
        if saved is not None:
            try:
                work.shares = Gather.from_record(saved, fold)
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("%s unusable (%s); asking again", shares_key, exc)
            else:
                work.shares.restarted(now, ctx.send)
                self._after_shares(work)
                return
        logger.info(
            "round %d: secure aggregation: %d devices gave keys; they share them",
            work.info.round,
            len(keys.answered),
        )
        work.shares = Gather.open(
            shares_key,
            fold,
            expected=keys.answered,
            online=ctx.view.online_devices(),
            now=now,
            timeout_s=self._config.keys_timeout_s,
            send=ctx.send,
            min_replies=work.setup.threshold,
        )
        self._changed(work, work.shares)

    def _after_shares(self, work: _Round) -> None:
        shares = work.shares
        if shares is None or shares.is_open:
            return
        if shares.status is not PhaseStatus.DONE:
            work.abandoned = (
                f"{len(shares.answered)} devices shared their mask keys, the "
                f"threshold is {work.setup.threshold}"
            )

    def _resume_masked(self, work: _Round) -> None:
        path = self._masked_path(work.info.round)
        if not path.exists():
            return
        try:
            masked = MaskedSum.from_file(path)
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("%s is damaged (%s): the round sums anew", path, exc)
            return
        if masked.version == work.info.version and masked.round == work.info.round:
            work.masked = masked

    def _changed(
        self, work: _Round, gather: Gather[Any, Any], replied: str | None = None
    ) -> None:
        """Save the gather in the message's transaction; move on once it closed."""
        ctx = self.ctx
        if gather is work.unmask:  # the whole record: it carries the signed request
            record = {
                "request": _unmask_request(gather),
                "gather": gather.to_record(),
            }
            ctx.view.store.save_phase(gather.key, work.info.round, record)
            return
        save_gather(ctx.view.store, gather, work.info.round, replied)
        if gather.is_open:
            return
        if gather is work.keys and work.shares is None:
            self._after_keys(work, ctx.clock())
        elif gather is work.shares:
            self._after_shares(work)

    def _work(self, round_index: int) -> _Round | None:
        work = self._round
        return work if work is not None and work.info.round == round_index else None

    def _masked_path(self, round_index: int) -> Path:
        return self._dir / f"masked-r{round_index}.npz"


def check_accountant(config: AggregationConfig) -> None:
    """Refuse ``noise_multiplier`` without the DP accountant (a setup error).

    Raises:
        ValueError: noise asked for, and the accountant is not installed.
    """
    if config.noise_multiplier > 0:
        try:
            require_accountant()
        except AccountantUnavailableError as exc:  # a setup error, not a crash
            raise ValueError(f"[aggregation] noise_multiplier: {exc}") from None


def _unmask_request(gather: Gather[Any, Any]) -> str:
    """The signed unmask request of an SA3 gather, as base64 wire bytes."""
    return base64.b64encode(encode(_unmask_of(gather))).decode("ascii")


def _unmask_of(gather: Gather[Any, Any]) -> SecAggUnmask:
    fold = gather.fold
    assert isinstance(fold, UnmaskFold)
    return fold.unmask


def _load_unmask_request(text: Any) -> SecAggUnmask:
    message = decode(base64.b64decode(str(text), validate=True))
    if not isinstance(message, SecAggUnmask):
        raise ValueError("not an unmask request")
    return message
