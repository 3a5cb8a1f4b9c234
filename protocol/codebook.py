"""Dubhe registry codebook: which registry slot stands for which set of classes.

The registry is the wire layout shared by devices and the coordinator (Dubhe
§5.1, eq. 5). For a reference set ``G`` (must contain ``C``) the slots are
all ``i``-subsets of the ``C`` classes for each ``i`` in ``G``, in
``itertools.combinations`` order (lexicographic), concatenated in increasing
``i``. The length is ``sum(comb(C, i) for i in G)``: 56 for ``C=10,
G={1,2,10}`` and 53 for ``C=52, G={1,52}``.

A *category* is a sorted tuple of class indices; its *index* is its slot.
Ranking is computed with the combinatorial number system, so a codebook never
materialises its slots unless asked to.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import comb

import numpy as np
from numpy.typing import NDArray

MAX_REGISTRY_LENGTH = 1_000_000
"""Longest registry accepted: beyond it packing and summing stop being cheap."""

Category = tuple[int, ...]

_COMB_CAP = 2**62


class CodebookError(ValueError):
    """A codebook, category or slot index that is not valid."""


def default_groups(num_classes: int) -> tuple[int, ...]:
    """The default reference set ``{1, 2, C}`` (Dubhe's), as a sorted tuple."""
    if num_classes < 2:
        raise CodebookError(f"need at least 2 classes, got {num_classes}")
    return tuple(sorted({1, 2, num_classes}))


@dataclass(frozen=True)
class Codebook:
    """The registry layout for ``num_classes`` classes and reference set ``groups``.

    Attributes:
        num_classes: C, the number of classes.
        groups: G as a strictly increasing tuple; always contains C.
    """

    num_classes: int
    groups: tuple[int, ...]

    def __post_init__(self) -> None:
        c = self.num_classes
        if c < 2:
            raise CodebookError(f"need at least 2 classes, got {c}")
        groups = tuple(sorted(set(self.groups)))
        if not groups or groups[0] < 1 or groups[-1] > c:
            raise CodebookError(f"groups must lie in 1..{c}, got {self.groups}")
        if groups[-1] != c:
            raise CodebookError(
                f"groups must contain C={c} (sigma_C = 0), got {groups}"
            )
        length = sum(comb(c, i) for i in groups)
        if length > MAX_REGISTRY_LENGTH:
            raise CodebookError(
                f"registry of {length} slots exceeds {MAX_REGISTRY_LENGTH}: "
                "choose smaller groups"
            )
        object.__setattr__(self, "groups", groups)

    @classmethod
    def default(cls, num_classes: int) -> Codebook:
        """The codebook with the default reference set ``{1, 2, C}``."""
        return cls(num_classes, default_groups(num_classes))

    @property
    def length(self) -> int:
        """Number of registry slots, ``sum(comb(C, i) for i in G)``."""
        return sum(comb(self.num_classes, i) for i in self.groups)

    def group_offset(self, size: int) -> int:
        """Index of the first slot of the ``size``-subsets."""
        if size not in self.groups:
            raise CodebookError(f"{size} is not in the reference set {self.groups}")
        return sum(comb(self.num_classes, i) for i in self.groups if i < size)

    def index_of(self, category: Iterable[int]) -> int:
        """Slot index of ``category`` (any order of its distinct classes)."""
        classes = sorted(int(x) for x in category)
        if len(set(classes)) != len(classes):
            raise CodebookError(f"category repeats a class: {classes}")
        if classes and (classes[0] < 0 or classes[-1] >= self.num_classes):
            raise CodebookError(f"class out of range 0..{self.num_classes - 1}")
        size = len(classes)
        offset = self.group_offset(size)
        return offset + _lex_rank(classes, self.num_classes)

    def category_at(self, index: int) -> Category:
        """The category stored at slot ``index`` (inverse of `index_of`)."""
        if not 0 <= index < self.length:
            raise CodebookError(f"slot {index} outside 0..{self.length - 1}")
        rest = index
        for size in self.groups:
            count = comb(self.num_classes, size)
            if rest < count:
                return _lex_unrank(rest, size, self.num_classes)
            rest -= count
        raise AssertionError("unreachable: index checked against length")

    def categories(self) -> list[Category]:
        """Every slot's category in registry order."""
        out: list[Category] = []
        for size in self.groups:
            out.extend(itertools.combinations(range(self.num_classes), size))
        return out

    def slot_sizes(self) -> NDArray[np.int64]:
        """Number of classes in each slot's category, in registry order."""
        return np.repeat(
            np.asarray(self.groups, dtype=np.int64),
            [comb(self.num_classes, i) for i in self.groups],
        )

    def indices_of(
        self, ranked_classes: NDArray[np.integer], sizes: NDArray[np.integer]
    ) -> NDArray[np.int64]:
        """Vectorised `index_of` for many devices.

        Args:
            ranked_classes: N x C class indices per device, most frequent first
                (only the first ``sizes[n]`` entries of row n are used).
            sizes: N category sizes, each in ``groups``.

        Returns:
            N slot indices.
        """
        ranked = np.asarray(ranked_classes, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        if ranked.ndim != 2 or ranked.shape[1] != self.num_classes:
            raise CodebookError(f"ranked_classes must be N x {self.num_classes}")
        if sizes.shape != (ranked.shape[0],):
            raise CodebookError("sizes must have one entry per row")
        out = np.empty(ranked.shape[0], dtype=np.int64)
        known = np.isin(sizes, self.groups)
        if not known.all():
            raise CodebookError(f"sizes outside the reference set {self.groups}")
        table = _comb_table(self.num_classes)
        for size in self.groups:
            rows = np.flatnonzero(sizes == size)
            if rows.size == 0:
                continue
            chosen = np.sort(ranked[rows, :size], axis=1)
            # lex rank = comb(C, i) - 1 - sum_j comb(C - 1 - c_j, i - j), j = 0..i-1
            exps = size - np.arange(size)
            tail = table[self.num_classes - 1 - chosen, exps].sum(axis=1)
            out[rows] = (
                self.group_offset(size) + comb(self.num_classes, size) - 1 - tail
            )
        return out


def _comb_table(n: int) -> NDArray[np.int64]:
    """``table[a, b] = comb(a, b)`` for 0 <= a, b <= n (zero when b > a).

    Entries are capped at 2**62: a valid rank only ever sums terms no larger
    than the registry length, so a capped entry is never used.
    """
    table = np.zeros((n + 1, n + 1), dtype=np.int64)
    for a in range(n + 1):
        for b in range(a + 1):
            table[a, b] = min(comb(a, b), _COMB_CAP)
    return table


def _lex_rank(classes: Sequence[int], n: int) -> int:
    """Position of sorted ``classes`` among the k-subsets of range(n), lex order."""
    k = len(classes)
    return comb(n, k) - 1 - sum(comb(n - 1 - c, k - j) for j, c in enumerate(classes))


def _lex_unrank(rank: int, k: int, n: int) -> Category:
    """The k-subset of range(n) at lexicographic position ``rank``."""
    out: list[int] = []
    start = 0
    for slot in range(k):
        remaining = k - slot - 1
        for c in range(start, n):
            block = comb(n - 1 - c, remaining)
            if rank < block:
                out.append(c)
                start = c + 1
                break
            rank -= block
    return tuple(out)
