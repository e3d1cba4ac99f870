"""Structured JSON logs on stderr for every hopline process: serve, agent, gateway (SPEC O-5).

Our loggers (``hopline.*``) never pass payloads, session ids, paths or prompts; their scalar
``extra`` fields are kept, and a ``record`` dict (the large-frame observer's attribution record)
is kept whole because it is built from low-sensitivity fields only. Records of other libraries
(uvicorn, asyncio, the ACP SDK) keep their message template only, never its arguments (an access
line or an exception argument may carry a path or a payload), except uvicorn's few start and stop
lines, whose arguments are a process id and the address it listens on. A traceback is written as its
frames only (module, function, line; innermost last), never its source lines, locals or arguments;
the exception's message only when the exception is hopline's own (whose messages are written to be
safe: sizes and setting names, never payloads).
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
_MESSAGE_CHARS = 512  # a hopline exception's message, bounded
_MAX_FRAMES = 40  # the innermost frames of a deep traceback
# uvicorn's own lines whose arguments are only a process id, a scheme, a host and a port.
_SAFE_FOREIGN_TEMPLATES = frozenset({
    "Started server process [%d]", "Finished server process [%d]",
    "Uvicorn running on %s://%s:%d (Press CTRL+C to quit)",
})


def _foreign_event(record: logging.LogRecord) -> str:
    if record.msg in _SAFE_FOREIGN_TEMPLATES and record.name.startswith("uvicorn"):
        try:
            return record.getMessage()
        except (TypeError, ValueError):  # pragma: no cover - a template whose arguments changed
            pass
    return str(record.msg)[:_TEMPLATE_CHARS]


def exception_fields(exc: BaseException) -> dict[str, Any]:
    """What an operator needs to find a fault, and nothing a payload could be in: the exception's
    type, the traceback's frames (module, function, line; innermost last), and the message only for
    hopline's own exceptions (those deriving from ``HoplineError``; named, not imported: ``logs``
    sits beside ``budget`` and imports nothing of ours)."""
    fields: dict[str, Any] = {"exception": type(exc).__name__}
    if any(c.__name__ == "HoplineError" and c.__module__.startswith("hopline.") for c in type(exc).__mro__):
        fields["exceptionMessage"] = str(exc)[:_MESSAGE_CHARS]
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append({"module": str(tb.tb_frame.f_globals.get("__name__", "?")),
                       "function": getattr(code, "co_qualname", code.co_name), "line": tb.tb_lineno})
        tb = tb.tb_next
    if frames:
        fields["frames"] = frames[-_MAX_FRAMES:]
    return fields


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ours = record.name.startswith("hopline")
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage() if ours else _foreign_event(record),
        }
        if ours:
            for key, value in vars(record).items():
                if key in _STANDARD:
                    continue
                scalar = isinstance(value, str | int | float | bool | type(None))
                if scalar or (key == "record" and isinstance(value, dict)):
                    entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            entry.update(exception_fields(record.exc_info[1]))
        elif record.exc_info and record.exc_info[0] is not None:
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
