"""Structured JSON logs on stderr for `hopline agent` (SPEC O-5).

Our own loggers (``hopline.*``) format their messages themselves and never pass payloads, session
ids, paths, prompts or tool output. Records from other libraries (the ACP SDK, asyncio) are logged
by their message template only, without arguments or exception text, because those may carry
payloads; only the exception type is kept.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

# Attributes every LogRecord has; anything else was passed in ``extra`` and is a structured field.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ours = record.name.startswith("hopline")
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage() if ours else str(record.msg)[:128],
        }
        if ours:
            for key, value in vars(record).items():
                if key not in _STANDARD and isinstance(value, str | int | float | bool | type(None)):
                    entry[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = record.exc_info[0].__name__
        return orjson.dumps(entry).decode()


def configure_stderr_json_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
