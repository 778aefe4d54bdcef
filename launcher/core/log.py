"""The launcher's own log lines, on stderr: ``trainer-launcher: ...`` or one JSON object a line,
secrets redacted (launcher.core.redaction)."""

from __future__ import annotations

import json
import sys
import time

from launcher.core.redaction import redact

_format = "text"


def configure(log_format: str) -> None:
    global _format
    _format = log_format


def _emit(level: str, message: str, fields: dict) -> None:
    if _format == "json":
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "level": level,
            "logger": "trainer-launcher",
            "msg": message,
            **fields,
        }
        line = json.dumps(record, default=str)
    else:
        line = f"trainer-launcher: {level + ': ' if level != 'info' else ''}{message}"
    print(redact(line), file=sys.stderr, flush=True)


def info(message: str, **fields) -> None:
    _emit("info", message, fields)


def warning(message: str, **fields) -> None:
    _emit("warning", message, fields)


def error(message: str, **fields) -> None:
    _emit("error", message, fields)
