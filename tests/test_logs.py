"""The JSON log line (SPEC O-5): frames of a traceback but never its text, uvicorn's start lines
formatted, foreign arguments never."""

from __future__ import annotations

import logging
import sys

import orjson

from hopline.budget import HoplineError
from hopline.logs import JsonLineFormatter

CANARY = "canary-9b1e/secret/path"


def formatted(record: logging.LogRecord) -> dict[str, object]:
    return dict(orjson.loads(JsonLineFormatter().format(record)))


def record(name: str, msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, exc_info)


def raise_value_error() -> None:
    raise ValueError(CANARY)


def test_uvicorns_start_line_is_formatted_and_other_foreign_arguments_are_not() -> None:
    assert formatted(record("uvicorn.error", "Started server process [%d]", 4242))["event"] == \
        "Started server process [4242]"
    line = formatted(record("uvicorn.error", "Uvicorn running on %s://%s:%d (Press CTRL+C to quit)",
                            "http", "127.0.0.1", 8080))
    assert line["event"] == "Uvicorn running on http://127.0.0.1:8080 (Press CTRL+C to quit)"
    assert formatted(record("uvicorn.error", "Invalid HTTP request %s", CANARY))["event"] == \
        "Invalid HTTP request %s"
    # The same template from a logger that is not uvicorn's keeps its template only.
    assert formatted(record("somelib", "Started server process [%d]", 1))["event"] == \
        "Started server process [%d]"


def test_a_traceback_is_its_frames_innermost_last_with_no_foreign_message() -> None:
    try:
        raise_value_error()
    except ValueError as exc:
        line = formatted(record("hopline.daemon", "failed", exc=exc))
    assert line["exception"] == "ValueError"
    assert "exceptionMessage" not in line
    frames = line["frames"]
    assert isinstance(frames, list)
    assert frames[-1] == {"module": __name__, "function": "raise_value_error",
                          "line": raise_value_error.__code__.co_firstlineno + 1}
    assert frames[0]["function"] == "test_a_traceback_is_its_frames_innermost_last_with_no_foreign_message"
    text = JsonLineFormatter().format(record("hopline.daemon", "failed", exc=sys.exc_info()[1] or None))
    assert CANARY not in str(line) and CANARY not in text


def test_hoplines_own_exception_keeps_its_message() -> None:
    class Refused(HoplineError):
        pass

    line = formatted(record("hopline.daemon", "failed", exc=Refused("limit 10 bytes, observed 11")))
    assert (line["exception"], line["exceptionMessage"]) == ("Refused", "limit 10 bytes, observed 11")
