"""The cross-round disaggregation attack on secure-aggregation sums.

Secure aggregation hides each device's update within a round, but the
coordinator sees every round's sum and who took part. Rounds overlap, so the
sums form a linear system in the per-device contributions: with rounds ``r``,
participation ``A[r, i]`` (0/1) and a per-class statistic per device
``p_i`` (e.g. its class shares, read off the output layer's bias change),

    target[r] = calibration(round_sum[r]) + |r| * baseline = sum_i A[r, i] p_i.

`disaggregate` solves it by non-negative least squares, one class at a time,
and names each device's dominant class. Once there are more (varied) rounds
than devices the system is exactly determined, and the attack recovers every
device's profile from noise-free sums: secure aggregation alone does not hide a
device's label skew across rounds. Noise on the sums (distributed DP) is what
defeats it; `synthetic_federation` generates the test population, and
`dominant_class_recovery` scores an attack against the truth.

First-order model of the bias change: for softmax cross-entropy the output
bias gradient on a device is (predicted share - true share), so one local step
moves the bias by ``lr * (p_i - g)`` with ``g`` the model's (global) share:
pass ``calibration = I / lr`` and ``baseline = g``. For a FedAvg-weighted sum
(``n_i * delta_i``) the unknowns are counts, not shares: pass the sums with
``baseline`` None after adding ``(sum of n_i) * g`` from the weight slot.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

NO_EVIDENCE = -1
"""The predicted class of a device no round (or no positive estimate) speaks of."""

SCIPY_UNAVAILABLE = "the disaggregation attack needs scipy: pip install 'ursa-fl[sim]'"


class SolverUnavailableError(RuntimeError):
    """scipy (its NNLS solver) is not installed; it comes with the ``sim`` extra."""


def _nnls() -> Callable[..., Any]:
    """Import scipy's NNLS lazily: scipy is no core dependency of ursa."""
    try:
        from scipy.optimize import nnls  # type: ignore[import-untyped]
    except ImportError as exc:
        raise SolverUnavailableError(SCIPY_UNAVAILABLE) from exc
    solver: Callable[..., Any] = nnls
    return solver


@dataclass(frozen=True)
class SyntheticFederation:
    """A skewed population, rounds of K devices, and each round's bias change.

    Attributes:
        counts: Examples per device and class, ``(devices, classes)``.
        participation: 1 where the device took part, ``(rounds, devices)``.
        round_sums: Each round's summed bias change, ``(rounds, classes)``:
            sum over its devices of (class shares - global share), plus noise.
        global_share: The pooled class shares ``g`` (the attack's baseline).
    """

    counts: IntArray
    participation: IntArray
    round_sums: FloatArray
    global_share: FloatArray


@dataclass(frozen=True)
class Disaggregation:
    """The attack's estimate.

    Attributes:
        profiles: Non-negative per-device statistic, ``(devices, classes)``.
        dominant: Each device's predicted dominant class, or `NO_EVIDENCE`.
        residuals: The least-squares residual norm per class.
    """

    profiles: FloatArray
    dominant: IntArray
    residuals: FloatArray


def synthetic_federation(
    rng: np.random.Generator,
    *,
    devices: int = 20,
    classes: int = 10,
    per_round: int = 8,
    rounds: int = 25,
    noise_std: float = 0.0,
    concentration: float = 0.3,
    examples: tuple[int, int] = (50, 500),
) -> SyntheticFederation:
    """Draw a label-skewed population and the bias changes rounds would release.

    Class shares come from a Dirichlet(``concentration``) per device (small is
    skewed), example counts uniformly from ``examples``; each round picks
    ``per_round`` devices uniformly without replacement, and its sum gets
    independent N(0, ``noise_std^2``) noise per class (the DP noise, in units
    of class share).
    """
    if not 1 <= per_round <= devices:
        raise ValueError(f"per_round must be in [1, {devices}], got {per_round}")
    if noise_std < 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    low, high = examples
    sizes = rng.integers(low, high + 1, size=devices)
    shares = rng.dirichlet(np.full(classes, concentration), size=devices)
    counts = np.stack(
        [rng.multinomial(n, p) for n, p in zip(sizes, shares, strict=True)]
    ).astype(np.int64)
    global_share = counts.sum(axis=0) / counts.sum()
    centred = counts / counts.sum(axis=1, keepdims=True) - global_share
    participation = np.zeros((rounds, devices), dtype=np.int64)
    for r in range(rounds):
        participation[r, rng.choice(devices, size=per_round, replace=False)] = 1
    noise = rng.normal(0.0, noise_std, size=(rounds, classes)) if noise_std else 0.0
    round_sums = participation @ centred + noise
    return SyntheticFederation(counts, participation, round_sums, global_share)


def participation_matrix(
    rounds: Sequence[Collection[str]], devices: Sequence[str]
) -> IntArray:
    """The 0/1 ``(rounds, devices)`` matrix from each round's set of device ids.

    Ids outside ``devices`` are refused: a contribution the attack cannot
    attribute would silently bias every estimate.
    """
    column = {device: i for i, device in enumerate(devices)}
    if len(column) != len(devices):
        raise ValueError("device ids must be unique")
    matrix = np.zeros((len(rounds), len(devices)), dtype=np.int64)
    for r, members in enumerate(rounds):
        unknown = set(members) - column.keys()
        if unknown:
            raise ValueError(f"round {r} has unknown devices {sorted(unknown)}")
        matrix[r, [column[device] for device in members]] = 1
    return matrix


def disaggregate(
    round_sums: npt.ArrayLike,
    participation: npt.ArrayLike,
    *,
    calibration: npt.ArrayLike | None = None,
    baseline: npt.ArrayLike | None = None,
) -> Disaggregation:
    """Estimate each device's per-class statistic from the rounds' sums.

    Args:
        round_sums: The released statistic per round, ``(rounds, stats)``.
        participation: 0/1 ``(rounds, devices)``: who is in each sum.
        calibration: Linear map ``(classes, stats)`` from a round's statistic
            to its sum of class shares; the identity when omitted.
        baseline: Per-device share ``(classes,)`` subtracted inside the
            statistic (the global share for a bias change), added back as
            ``|r| * baseline``; zero when omitted.

    Returns:
        Non-negative profiles, the dominant class per device (`NO_EVIDENCE`
        for a device in no round or with an all-zero estimate), residuals.

    Raises:
        ValueError: shapes that do not match, or participation not 0/1.
        SolverUnavailableError: scipy is not installed.
    """
    nnls = _nnls()
    sums = np.atleast_2d(np.asarray(round_sums, dtype=np.float64))
    members = np.asarray(participation, dtype=np.float64)
    if members.ndim != 2 or members.shape[0] != sums.shape[0]:
        raise ValueError(
            f"participation {members.shape} does not match round sums {sums.shape}"
        )
    if not np.isin(members, (0.0, 1.0)).all():
        raise ValueError("participation must be 0/1")
    mapping = (
        np.eye(sums.shape[1])
        if calibration is None
        else np.asarray(calibration, dtype=np.float64)
    )
    if mapping.ndim != 2 or mapping.shape[1] != sums.shape[1]:
        raise ValueError(f"calibration {mapping.shape} does not map {sums.shape[1]}")
    targets = sums @ mapping.T
    if baseline is not None:
        offset = np.asarray(baseline, dtype=np.float64)
        if offset.shape != (targets.shape[1],):
            raise ValueError(f"baseline must have shape ({targets.shape[1]},)")
        targets = targets + members.sum(axis=1, keepdims=True) * offset
    devices, classes = members.shape[1], targets.shape[1]
    profiles = np.zeros((devices, classes))
    residuals = np.zeros(classes)
    for j in range(classes):
        profiles[:, j], residuals[j] = nnls(members, targets[:, j])
    dominant = np.argmax(profiles, axis=1).astype(np.int64)
    silent = (members.sum(axis=0) == 0) | (profiles.max(axis=1) <= 0.0)
    dominant[silent] = NO_EVIDENCE
    return Disaggregation(profiles, dominant, residuals)


def dominant_class_recovery(
    true_counts: npt.ArrayLike, predicted: npt.ArrayLike
) -> float:
    """Share of devices whose predicted class is one of their most frequent ones.

    Chance is about ``1 / classes`` for a guess that ignores the data;
    `NO_EVIDENCE` never counts as named.
    """
    counts = np.asarray(true_counts)
    guesses = np.asarray(predicted, dtype=np.int64)
    if counts.ndim != 2 or guesses.shape != (counts.shape[0],):
        raise ValueError(
            f"predicted {guesses.shape} does not match counts {counts.shape}"
        )
    if counts.shape[0] == 0:
        raise ValueError("no devices to score")
    valid = (guesses >= 0) & (guesses < counts.shape[1])
    picked = counts[np.arange(counts.shape[0]), np.where(valid, guesses, 0)]
    named = valid & (picked == counts.max(axis=1))
    return float(named.mean())
