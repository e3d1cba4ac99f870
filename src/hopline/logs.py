"""Structured JSON logs on stderr for every hopline process: serve, agent, gateway (SPEC O-5).

Our loggers (``hopline.*``) never pass payloads, session ids, paths or prompts; their scalar
``extra`` fields are kept, and a ``record`` dict (the large-frame observer's attribution record)
is kept whole because it is built from low-sensitivity fields only. Records of other libraries
(uvicorn, asyncio, the ACP SDK) keep their message template only, never its arguments (an access
line or an exception argument may carry a path or a payload). Tracebacks are never written: only
the exception type.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

# Attributes every LogRecord has; anything else was passed in ``extra``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}
_TEMPLATE_CHARS = 128  # foreign message templates are cut, they are not ours to trust


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ours = record.name.startswith("hopline")
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage() if ours else str(record.msg)[:_TEMPLATE_CHARS],
        }
        if ours:
            for key, value in vars(record).items():
                if key in _STANDARD:
                    continue
                scalar = isinstance(value, str | int | float | bool | type(None))
                if scalar or (key == "record" and isinstance(value, dict)):
                    entry[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = record.exc_info[0].__name__
        try:
            return orjson.dumps(entry, default=str).decode()
        except TypeError:  # pragma: no cover - default=str makes every value serializable
            return orjson.dumps({"level": entry["level"], "logger": entry["logger"]}).decode()


def configure_json_logging(level: int = logging.INFO) -> None:
    """One JSON handler on the root logger; uvicorn's loggers propagate to it (no access log:
    request lines carry session ids)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
