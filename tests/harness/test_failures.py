from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from hopline.errors import TurnFailure
from hopline.harness.failures import (
    Attempt,
    Reaction,
    ReactionKind,
    classify_exception,
    classify_http_status,
    react,
)

STATUS_TABLE = [
    (413, "", "code", True, False),
    (400, '{"error": {"code": "context_length_exceeded"}}', "code", True, False),
    (400, "This model's maximum context length is 128000 tokens", "code", True, False),
    (400, "bad field", "code", False, False),
    (429, "too many tokens per minute", "model", False, True),
    (500, "", "model", False, True),
    (502, "", "model", False, True),
    (503, "", "model", False, True),
    (504, "", "model", False, True),
    (408, "", "model", False, True),
]


@pytest.mark.parametrize(("status", "body", "origin", "size_error", "retryable"), STATUS_TABLE)
def test_http_status_origins(status: int, body: str, origin: str, size_error: bool, retryable: bool) -> None:
    failure = classify_http_status(status, body, body_bytes=123, limit_bytes=100)
    assert (failure.origin, failure.size_error, failure.retryable) == (origin, size_error, retryable)
    assert failure.status == status and str(status) in failure.message


EXCEPTION_TABLE = [
    (ConnectionResetError(), True, "code", True, False),
    (httpx.WriteError("reset"), True, "code", True, False),
    (BrokenPipeError(), True, "code", True, False),
    (ConnectionResetError(), False, "model", False, True),
    (httpx.ReadTimeout("t"), False, "model", False, True),
    (TimeoutError(), True, "model", False, True),
    (httpx.ConnectError("refused"), False, "model", False, True),
    (asyncio.CancelledError(), False, "cancelled", False, False),
]


@pytest.mark.parametrize(("exc", "uploading", "origin", "size_error", "retryable"), EXCEPTION_TABLE)
def test_exception_origins(exc: BaseException, uploading: bool, origin: str, size_error: bool,
                           retryable: bool) -> None:
    failure = classify_exception(exc, during_upload=uploading, body_bytes=9_000_000)
    assert (failure.origin, failure.size_error, failure.retryable) == (origin, size_error, retryable)


# --- the reaction table (H-8): every failure kind at every attempt ----------------------------------


_SIZE = TurnFailure("code", "413", status=413, size_error=True)
_TRANSIENT = TurnFailure("model", "503", status=503, retryable=True)
_FINAL = TurnFailure("model", "malformed")
_BOUNDS: dict[str, Any] = {"max_model_retries": 2, "backoff_seconds": 0.5}


@pytest.mark.parametrize(("failure", "attempt", "reaction"), [
    (_SIZE, Attempt(**_BOUNDS), Reaction(ReactionKind.COMPACT_AND_RETRY)),
    (_SIZE, Attempt(**_BOUNDS, size_retries=1),
     Reaction(ReactionKind.FAIL, detail="after compaction and one retry")),
    (_SIZE, Attempt(**_BOUNDS, max_size_retries=0),
     Reaction(ReactionKind.FAIL, detail="(sent once: no compaction and resend after a size failure)")),
    (_SIZE, Attempt(**_BOUNDS, size_retries=1, max_size_retries=2), Reaction(ReactionKind.COMPACT_AND_RETRY)),
    (_SIZE, Attempt(**_BOUNDS, size_retries=2, max_size_retries=2),
     Reaction(ReactionKind.FAIL, detail="after compaction and 2 retries")),
    (_SIZE, Attempt(**_BOUNDS, model_retries=2), Reaction(ReactionKind.COMPACT_AND_RETRY)),
    (_TRANSIENT, Attempt(**_BOUNDS), Reaction(ReactionKind.RETRY, delay_seconds=0.5)),
    (_TRANSIENT, Attempt(**_BOUNDS, model_retries=1), Reaction(ReactionKind.RETRY, delay_seconds=1.0)),
    (_TRANSIENT, Attempt(**_BOUNDS, model_retries=2), Reaction(ReactionKind.FAIL)),  # at the bound
    (_TRANSIENT, Attempt(**_BOUNDS, size_retries=1), Reaction(ReactionKind.RETRY, delay_seconds=0.5)),
    (_TRANSIENT, Attempt(**_BOUNDS, max_size_retries=0), Reaction(ReactionKind.RETRY, delay_seconds=0.5)),
    (_FINAL, Attempt(**_BOUNDS), Reaction(ReactionKind.FAIL)),
    (TurnFailure("cancelled", "cancelled"), Attempt(**_BOUNDS), Reaction(ReactionKind.FAIL)),
])
def test_react_table(failure: TurnFailure, attempt: Attempt, reaction: Reaction) -> None:
    assert react(failure, attempt) == reaction


def test_an_attempt_moves_on_without_changing_its_bounds() -> None:
    attempt = Attempt(**_BOUNDS).retried_model().retried_model().retried_size()
    assert (attempt.model_retries, attempt.size_retries, attempt.max_model_retries) == (2, 1, 2)
    assert attempt.max_size_retries == 1
