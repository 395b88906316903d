"""Process-wide logging for `brain serve`: plain text or one JSON object per
line (like etcd's zap logger), to stderr.

Structured values go in ``extra={"fields": {...}}``; the text format appends
them as key=value pairs (a list as JSON), the JSON format merges them into
the object.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _timestamp(record: logging.LogRecord) -> str:
    t = time.gmtime(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict:
    f = getattr(record, "fields", None)
    return f if isinstance(f, dict) else {}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<5} {record.name}: {record.getMessage()}"
        for k, v in _fields(record).items():
            if isinstance(v, (list, tuple)):  # as JSON, ["a","b"]: brackets show an empty one
                line += f" {k}={json.dumps(list(v), separators=(',', ':'))}"
                continue
            v = str(v)
            line += f" {k}={json.dumps(v) if (' ' in v or not v) else v}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj = {
            "level": record.levelname.lower().replace("warning", "warn"),
            "ts": _timestamp(record),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in _fields(record).items():
            obj.setdefault(k, v)
        if record.exc_info:
            obj["error"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str)


def configure(level: str = "info", fmt: str = "text", stream=None) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones
    installed here, so calling it twice is harmless)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler._brain = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_brain", False):
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.INFO))
