"""Portable spellings of what Python 3.11 added, for 3.10 (Jetson's JetPack 6).

Import `StrEnum` and `tomllib` from here, and `Self` from `typing_extensions`
(a pydantic dependency), so the package runs on Python 3.10 to 3.13.
"""

from __future__ import annotations

import enum
import sys

__all__ = ["StrEnum", "tomllib"]

if sys.version_info >= (3, 11):
    from enum import StrEnum

    import tomllib
else:  # pragma: no cover - exercised by the 3.10 CI run
    import tomli as tomllib

    class StrEnum(str, enum.Enum):
        """`enum.StrEnum` of 3.11: members are strings and print as their value."""

        def __str__(self) -> str:
            return str(self.value)

        @staticmethod
        def _generate_next_value_(
            name: str, start: int, count: int, last_values: list[object]
        ) -> str:
            return name.lower()
