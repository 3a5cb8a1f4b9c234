"""The coordinator's pure core of secure aggregation: sum masked inputs, unmask the sum.

The coordinator only ever holds the running sum of masked vectors
(`add_masked`) and, at the end, the shares the survivors reveal. `unmask_sum`
rebuilds each survivor's self-mask seed b_u and each dropped device's mask key
s_u, regenerates their masks and removes them::

    sum x_u (u in U3) = sum y_u - sum_{u in U3} PRG(b_u)
                        - sum_{u dropped} sum_{v in N(u) ∩ U3} sign(v, u) PRG(s_uv)

where sign(v, u) = +1 if u > v (v added that mask) and -1 otherwise. Masks
between two survivors cancel; masks between two dropped devices were never
summed.

Nothing is trusted silently: a share must come from a holder that survived, at
the index the holder list gives it; a rebuilt s_u must match the public key u
advertised; redundant shares of b_u must agree. Otherwise `UnmaskError` names
the owners concerned, and the round is to be abandoned rather than a corrupt
sum published.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from ursa.crypto.errors import CryptoError
from ursa.crypto.mask_stream import (
    PAIR_MASK_LABEL,
    SELF_MASK_LABEL,
    Mask,
    apply_masks,
    pair_context,
    pairwise_seed,
)
from ursa.crypto.neighbour_graph import (
    graph_seed,
    neighbours,
    share_holders,
    share_threshold,
)
from ursa.crypto.shamir import (
    SecretKind,
    Share,
    ShareError,
    UnmaskShare,
    combine_shares,
)

__all__ = ["UnmaskError", "add_masked", "unmask_sum"]


class UnmaskError(CryptoError):
    """The sum cannot be unmasked; ``owners`` are the devices whose secrets failed."""

    def __init__(self, message: str, owners: Collection[str] = ()) -> None:
        super().__init__(message)
        self.owners: tuple[str, ...] = tuple(sorted(owners))


def add_masked(
    total: NDArray[np.uint32], masked: NDArray[np.uint32]
) -> NDArray[np.uint32]:
    """The running sum plus one masked vector, mod 2^32 (a new array).

    Raises:
        ValueError: not two uint32 vectors of the same shape.
    """
    if (
        not isinstance(total, np.ndarray)
        or not isinstance(masked, np.ndarray)
        or total.dtype != np.uint32
        or masked.dtype != np.uint32
        or total.shape != masked.shape
    ):
        raise ValueError("add_masked takes two uint32 vectors of the same shape")
    summed: NDArray[np.uint32] = total + masked
    return summed


def unmask_sum(
    masked_total: NDArray[np.uint32],
    *,
    federation: str,
    run: str,
    round_index: int,
    participants: Sequence[str],
    adverts: Mapping[str, bytes],
    survivors: Collection[str],
    dropped: Collection[str],
    shares: Mapping[str, Sequence[UnmaskShare]],
    threshold: int,
    degree: int,
) -> NDArray[np.uint32]:
    """Remove every mask from the sum of the survivors' masked inputs.

    Args:
        masked_total: sum (mod 2^32) of the masked vectors of ``survivors``.
        federation: as given to every participant.
        run: as given to every participant.
        round_index: as given to every participant.
        participants: U1, the roster the graph was built from (the list sent
            in SecAggRoster), not U2.
        adverts: the advertised ``s_public`` (32 bytes) of every device in
            U2 = survivors + dropped.
        survivors: U3, whose masked inputs are in ``masked_total``.
        dropped: U2 minus U3, devices that sent shares but no counted input.
        shares: revealed shares grouped by owner (`UnmaskShare.owner`), from
            any survivors; each b_u of a survivor and s_u of a dropped device
            needs `share_threshold` of them.
        threshold: the round's threshold t.
        degree: the configured graph degree (as given to the participants).

    Returns:
        The exact sum mod 2^32 of the survivors' encoded inputs x_u.

    Raises:
        UnmaskError: too few survivors; inconsistent lists; some owners lack
            shares, carry misplaced or contradicting shares, or rebuild to a key
            other than the advertised one (``owners`` lists them).
    """
    ids = sorted(participants)
    alive, gone = set(survivors), set(dropped)
    _check_sets(ids, alive, gone, adverts, threshold)
    if masked_total.dtype != np.uint32 or masked_total.ndim != 1:
        raise ValueError("masked_total must be a 1-D uint32 vector")
    try:
        threshold_n = share_threshold(threshold, len(ids), degree)
    except ValueError as exc:
        raise UnmaskError(str(exc)) from exc
    graph = neighbours(ids, degree, graph_seed(federation, run, round_index))
    secrets: dict[str, bytes] = {}
    failures: dict[str, str] = {}
    for owner in sorted(alive | gone):
        kind: SecretKind = "b" if owner in alive else "s"
        try:
            picked = _owner_shares(graph, owner, kind, shares.get(owner, ()), alive)
            if len(picked) < threshold_n:
                raise UnmaskError(
                    f"{len(picked)} shares of {kind}, {threshold_n} needed"
                )
            secrets[owner] = combine_shares(picked, threshold_n)
        except (UnmaskError, ShareError) as exc:
            failures[owner] = str(exc)
    if failures:
        detail = "; ".join(f"{owner}: {why}" for owner, why in failures.items())
        raise UnmaskError(f"cannot rebuild secrets of {detail}", tuple(failures))

    masks = [Mask(secrets[owner], SELF_MASK_LABEL, True) for owner in sorted(alive)]
    for owner in sorted(gone):
        private = X25519PrivateKey.from_private_bytes(secrets[owner])
        if private.public_key().public_bytes_raw() != adverts[owner]:
            raise UnmaskError(
                f"rebuilt s key of {owner!r} does not match its advert: a wrong share",
                (owner,),
            )
        for peer in graph[owner]:
            if peer not in alive:
                continue
            context = pair_context(federation, run, round_index, owner, peer)
            try:
                seed = pairwise_seed(private, adverts[peer], context)
            except CryptoError as exc:
                raise UnmaskError(
                    f"pairwise key {owner}-{peer}: {exc}", (peer,)
                ) from exc
            # owner > peer: the survivor added this mask, so it comes off
            masks.append(Mask(seed, PAIR_MASK_LABEL, subtract=owner > peer))
    total: NDArray[np.uint32] = masked_total.copy()
    apply_masks(total, masks)
    return total


def _check_sets(
    ids: Sequence[str],
    alive: set[str],
    gone: set[str],
    adverts: Mapping[str, bytes],
    threshold: int,
) -> None:
    if len(set(ids)) != len(ids):
        raise UnmaskError("duplicate participant ids")
    if alive & gone:
        raise UnmaskError(
            f"survivors and dropped overlap: {sorted(alive & gone)}", alive & gone
        )
    strangers = (alive | gone) - set(ids)
    if strangers:
        raise UnmaskError(f"not participants: {sorted(strangers)}", strangers)
    if len(alive) < threshold:
        raise UnmaskError(
            f"{len(alive)} survivors, fewer than the threshold {threshold}"
        )
    missing = sorted(u for u in alive | gone if len(adverts.get(u, b"")) != 32)
    if missing:
        raise UnmaskError(f"no 32-byte s_public advert for {missing}", missing)


def _owner_shares(
    graph: Mapping[str, tuple[str, ...]],
    owner: str,
    kind: SecretKind,
    revealed: Sequence[UnmaskShare],
    alive: set[str],
) -> list[Share]:
    holders = share_holders(graph, owner)
    picked: dict[int, Share] = {}
    for item in revealed:
        if item.owner != owner:
            raise UnmaskError(f"a share of {item.owner!r} filed under {owner!r}")
        if item.kind != kind:
            raise UnmaskError(
                f"a share of {item.kind} revealed, but {owner!r} needs {kind}"
            )
        index = item.share.index
        if not 1 <= index <= len(holders) or holders[index - 1] not in alive:
            raise UnmaskError(f"share index {index} is no surviving holder's")
        earlier = picked.setdefault(index, item.share)
        if earlier != item.share:
            raise UnmaskError(f"two different shares at index {index}")
    return [picked[index] for index in sorted(picked)]
