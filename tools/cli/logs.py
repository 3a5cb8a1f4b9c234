r"""Logging set-up of the ``ursa`` commands: text for people, JSON lines for shippers.

``--log-format json`` writes one JSON object per line (``time`` in UTC ISO
8601, ``level``, ``logger``, ``message``, and ``exception`` with the
traceback when there is one), which journald, Loki, Vector or Fluent Bit
take as they are.

Either way a record cannot forge another: its message is escaped
(`ursa.protocol.untrusted_text`: newlines, ANSI escapes and bidi controls
written as ``\n``, ``\x1b``, ``\u202e``), as is each line of its traceback,
and in text those lines are indented, so nothing a device or coordinator
sent starts a line that looks like a record. The refusal paths escape at
the source already; this is the net under every other log call.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

from ursa.protocol.untrusted_text import escape

__all__ = ["LOG_FORMATS", "JsonFormatter", "TextFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_LINE = 65_536
"""Characters of one message (or traceback line) written at most."""
INDENT = "    "
"""Starts every line of a text record after its first."""


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, one line per record plus its traceback's, indented."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        """The record's line, its message escaped."""
        message = record.message
        record.message = escape(message, MAX_LINE)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message

    def format(self, record: logging.LogRecord) -> str:
        """The line, then each traceback or stack line escaped and indented."""
        head, *tail = super().format(record).split("\n")
        return "\n".join([head, *(INDENT + line for line in _inert_lines(tail))])


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON object."""
        stamp = datetime.fromtimestamp(record.created, tz=timezone.utc)
        document: dict[str, object] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": escape(record.getMessage(), MAX_LINE),
        }
        if record.exc_info:
            document["exception"] = _inert(self.formatException(record.exc_info))
        if record.stack_info:
            document["stack"] = _inert(self.formatStack(record.stack_info))
        return json.dumps(document, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level`` in ``log_format`` (``text`` or ``json``).

    Raises:
        ValueError: an unknown level or format.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}")
    handler = logging.StreamHandler()
    formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler])


def _inert_lines(lines: list[str]) -> list[str]:
    return [escape(line, MAX_LINE) for line in lines]


def _inert(text: str) -> str:
    """Multi-line text (a traceback) with each line escaped, the newlines kept."""
    return "\n".join(_inert_lines(text.split("\n")))
