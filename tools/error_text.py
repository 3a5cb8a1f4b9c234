"""Errors as short text for operators: pydantic's without their input values.

`str(ValidationError)` spans several lines per error and repeats each input
(``input_value=...``), which may be a secret or a large array; `brief` keeps
the key path and the reason only.
"""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["brief"]


def brief(exc: BaseException) -> str:
    """One line: ``key: reason; ...`` for a `ValidationError`, else ``str(exc)``."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    parts = []
    for error in exc.errors(include_input=False, include_url=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = ".".join(str(part) for part in error["loc"])
        parts.append(f"{loc}: {message}" if loc else message)
    return "; ".join(parts)
