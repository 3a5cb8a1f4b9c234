"""Logging set-up of the ``ursa`` commands: text for people, JSON lines for shippers.

``--log-format json`` writes one JSON object per line (``time`` in UTC ISO
8601, ``level``, ``logger``, ``message``, and ``exception`` with the
traceback when there is one), which journald, Loki, Vector or Fluent Bit
take as they are. The stdlib's `json` and `logging` only.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON object."""
        stamp = datetime.fromtimestamp(record.created, tz=timezone.utc)
        document: dict[str, object] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level`` in ``log_format`` (``text`` or ``json``).

    Raises:
        ValueError: an unknown level or format.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}")
    handler = logging.StreamHandler()
    formatter = (
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler])
