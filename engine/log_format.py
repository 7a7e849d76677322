"""`formwork serve --log-format json`: one JSON object a line, for log pipelines (the front end's
process and the engine's alike).

    {"time": "2026-12-01T12:00:00.123Z", "level": "INFO", "logger": "service.request_log",
     "message": "request req-1#1 stop: ...", "request": {"id": "req-1#1", "status": "stop", ...}}

A record's `extra` fields that are not the logging module's own (the finished-request line's
`request`) become top-level keys; an exception becomes "exception" with its traceback.
"""
from __future__ import annotations

import json
import logging
import time

# the attributes every LogRecord has: anything else came from `extra`
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: int, log_format: str, prefix: str = "[formwork]") -> None:
    """The root logger's handler: text ("[formwork] INFO name: message") or "json"."""
    if log_format not in ("text", "json"):
        raise ValueError(f"the log format must be text or json, got {log_format!r}")
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"{prefix} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
