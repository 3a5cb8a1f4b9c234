"""Operators' error text: pydantic's errors without their inputs."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError, model_validator

from ursa.tools.error_text import brief


class _Inner(BaseModel):
    token: str
    count: int


class _Outer(BaseModel):
    inner: _Inner

    @model_validator(mode="after")
    def _check(self) -> _Outer:
        if self.inner.count > 3:
            raise ValueError("count is at most 3")
        return self


def test_validation_errors_keep_key_and_reason_not_input() -> None:
    with pytest.raises(ValidationError) as caught:
        _Outer.model_validate({"inner": {"token": ["hunter2"], "count": "many"}})
    text = brief(caught.value)
    assert "hunter2" not in text and "many" not in text and "\n" not in text
    assert text == (
        "inner.token: Input should be a valid string; "
        "inner.count: Input should be a valid integer, unable to parse string as "
        "an integer"
    )


def test_model_errors_and_other_exceptions() -> None:
    with pytest.raises(ValidationError) as caught:
        _Outer.model_validate({"inner": {"token": "t", "count": 4}})
    assert brief(caught.value) == "count is at most 3"
    assert brief(OSError("no such file")) == "no such file"
