from __future__ import annotations

import asyncio

import httpx
import pytest

from hopline.harness.failures import classify_exception, classify_http_status

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
