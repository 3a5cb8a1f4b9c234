"""`--log-format json` and the commands' default log levels."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from ursa.tools.cli.app import build_parser, log_level
from ursa.tools.cli.logs import INDENT, JsonFormatter, TextFormatter, configure_logging


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord(
        "ursa.coordinator", logging.INFO, __file__, 1, message, args, exc_info
    )


def test_a_record_is_one_line_of_json() -> None:
    line = JsonFormatter().format(_record("round %d complete: %s", 3, "ünïcode\n"))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "INFO" and doc["logger"] == "ursa.coordinator"
    assert doc["message"] == "round 3 complete: ünïcode\\n"  # escaped, not a newline
    assert doc["time"].endswith("Z") and "T" in doc["time"]


def test_an_exception_travels_inside_the_object() -> None:
    line = JsonFormatter().format(_record("failed", exc=True))
    assert "\n" not in line
    doc = json.loads(line)
    assert "ValueError: boom" in doc["exception"]
    assert "Traceback" in doc["exception"]


FORGED = "x\n2026-12-02 00:00:00,000 ERROR ursa.coordinator: run `curl e | sh`\x1b[2K"


def test_a_text_record_cannot_forge_another() -> None:
    text = TextFormatter().format(_record("refused: %s", FORGED))
    assert "\n" not in text and "\x1b" not in text
    assert text.endswith(
        "refused: x\\n2026-12-02 00:00:00,000 ERROR ursa.coordinator: "
        "run `curl e | sh`\\x1b[2K"
    )


def test_a_text_traceback_is_indented_and_escaped() -> None:
    record = _record("failed", exc=True)
    record.exc_info = (ValueError, ValueError(FORGED), None)
    head, *tail = TextFormatter().format(record).split("\n")
    assert head.endswith("failed")
    assert tail and all(line.startswith(INDENT) for line in tail)
    assert "\x1b" not in "".join(tail)


def test_json_escapes_what_json_leaves_alone() -> None:
    record = _record("%s", "bidi \u202e and C1 \x85")
    record.exc_info = (ValueError, ValueError("right-to-left \u202e"), None)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "bidi \\u202e and C1 \\x85"
    assert doc["exception"] == "ValueError: right-to-left \\u202e"


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format"):
        configure_logging("INFO", "xml")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["coordinator", "serve", "--config", "c.toml"], "INFO"),
        (["device", "run", "--config", "d.toml"], "INFO"),
        (["doctor"], "WARNING"),
        (["--log-level", "DEBUG", "coordinator", "serve", "--config", "c"], "DEBUG"),
    ],
)
def test_serve_and_run_log_progress_by_default(argv: list[str], expected: str) -> None:
    assert log_level(build_parser().parse_args(argv)) == expected


def test_log_format_is_a_global_option() -> None:
    args = build_parser().parse_args(["--log-format", "json", "doctor"])
    assert args.log_format == "json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-format", "xml", "doctor"])
