"""What both sides agree a method is: its name and its role in a round.

Each side's ``[[methods]]`` list (`ursa.coordinator.methods_config`,
`ursa.edge_sdk.methods_config`) is checked against these rules, and the
coordinator signs the names into every `KeyEpochStart`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ursa._compat import StrEnum

__all__ = ["MethodLike", "MethodRole", "MethodsError", "check_method_list"]


class MethodRole(StrEnum):
    """What a method provides: one selection, at most one training and balancing."""

    SELECTION = "selection"
    TRAINING = "training"
    BALANCING = "balancing"
    """Runs once, after enrolment and before the first key epoch (FLICKER)."""


class MethodsError(ValueError):
    """A ``[[methods]]`` list that cannot run (said in one line)."""


class MethodLike(Protocol):
    """A ``[[methods]]`` table as the rules see it."""

    @property
    def kind(self) -> str:
        """The method's name (the table's ``kind``)."""
        ...

    @property
    def role(self) -> MethodRole:
        """What it provides to a round."""
        ...


def check_method_list(methods: Sequence[MethodLike]) -> None:
    """Refuse a list no federation can run: one reason, first found.

    Raises:
        MethodsError: a kind twice, not exactly one selection method, or two
            training or two balancing methods.
    """
    kinds = [m.kind for m in methods]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise MethodsError(f"[[methods]] lists {', '.join(twice)} more than once")
    roles = ((MethodRole.SELECTION, 1), (MethodRole.TRAINING, 0))
    for role, least in (*roles, (MethodRole.BALANCING, 0)):
        named = [m.kind for m in methods if m.role is role]
        if len(named) > 1:
            raise MethodsError(
                f"[[methods]] has {len(named)} {role} methods "
                f"({', '.join(named)}); choose one"
            )
        if len(named) < least:
            raise MethodsError(f"[[methods]] needs a {role} method (e.g. dubhe)")
