"""Turn failures (SPEC H-8): their classification and the loop's reaction, both as data.

``413 -> code``, never ``model``: a body too large for a hop is our side's doing (blaming the
provider sends the operator to the wrong fix). Size errors carry ``size_error=True``; transient
provider errors carry ``retryable=True``. :func:`react` is the whole policy: a size error compacts
and retries once, a transient error retries with bounded backoff, everything else fails the turn
with its origin.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import re

from hopline.budget import CEILINGS_BY_KEY, HOP_ENGINE, HOP_PROVIDER
from hopline.errors import Origin, TurnFailure


@dataclasses.dataclass(frozen=True)
class Rule:
    origin: Origin
    size_error: bool
    retryable: bool
    what: str


# Provider/gateway error texts that mean "the request is too large for the model or a hop".
CONTEXT_LENGTH_RE = re.compile(
    r"context[_ ]length|maximum context|context window|too many tokens|prompt is too long|"
    r"request too large|request entity too large|payload too large|body too large|max_tokens.*exceed",
    re.IGNORECASE,
)

STATUS_RULES: dict[int, Rule] = {
    413: Rule("code", True, False, "request entity too large"),
    408: Rule("model", False, True, "request timeout"),
    429: Rule("model", False, True, "rate limited"),
    500: Rule("model", False, True, "provider internal error"),
    502: Rule("model", False, True, "bad gateway"),
    503: Rule("model", False, True, "provider unavailable"),
    504: Rule("model", False, True, "gateway timeout"),
}
CONTEXT_LENGTH_RULE = Rule("code", True, False, "context length exceeded")
OTHER_4XX_RULE = Rule("code", False, False, "request refused")
OTHER_5XX_RULE = Rule("model", False, False, "provider error")


def classify_http_status(status: int, body_text: str = "", *, hop: str = HOP_PROVIDER,
                         body_bytes: int | None = None, limit_bytes: int | None = None) -> TurnFailure:
    """The failure for an HTTP error answer; the body text can reveal a context-length error."""
    rule = STATUS_RULES.get(status)
    if rule is None:
        # A 400 saying "context length exceeded" is a size error of ours; a 429 saying "too many
        # tokens per minute" is a rate limit, so only statuses without a rule look at the text.
        if 400 <= status < 500 and CONTEXT_LENGTH_RE.search(body_text):
            rule = CONTEXT_LENGTH_RULE
        else:
            rule = OTHER_4XX_RULE if 400 <= status < 500 else OTHER_5XX_RULE
    detail = body_text.strip().replace("\n", " ")[:200]
    message = f"HTTP {status} ({rule.what}) from {hop}"
    if body_bytes is not None:
        message += f" for a body of {body_bytes} bytes"
    if limit_bytes is not None:
        message += f" (limit {limit_bytes} bytes)"
    if detail:
        message += f": {detail}"
    return TurnFailure(rule.origin, message, status=status, hop=hop, observed_bytes=body_bytes,
                       limit_bytes=limit_bytes, size_error=rule.size_error, retryable=rule.retryable)


# (exception class names, while uploading?) -> rule. Names, so httpx need not be imported here.
_RESET_NAMES = {"ConnectionResetError", "BrokenPipeError", "WriteError", "ConnectionAbortedError"}
_TIMEOUT_NAMES = {"TimeoutError", "TimeoutException", "ReadTimeout", "WriteTimeout", "ConnectTimeout",
                  "PoolTimeout"}
_TRANSIENT_NAMES = {"ConnectError", "RemoteProtocolError", "ReadError", "NetworkError"}


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def classify_exception(exc: BaseException, *, during_upload: bool = False, hop: str = HOP_ENGINE,
                       body_bytes: int | None = None) -> TurnFailure:
    """The failure for a transport exception.

    A connection reset or broken pipe while the body is being uploaded is the peer refusing a body
    too large for it (origin ``code``, size error); timeouts and other network errors are
    transient ``model`` failures.
    """
    if isinstance(exc, TurnFailure):
        return exc
    names = _names(exc)
    sized = f" while uploading a body of {body_bytes} bytes" if body_bytes is not None else ""
    if isinstance(exc, asyncio.CancelledError):
        return TurnFailure("cancelled", "the turn was cancelled", hop=hop)
    if names & _TIMEOUT_NAMES:
        return TurnFailure("model", f"timeout on {hop}: {type(exc).__name__}", hop=hop, retryable=True,
                           observed_bytes=body_bytes)
    if names & _RESET_NAMES and during_upload:
        return TurnFailure("code", f"connection reset by {hop}{sized}: the peer refused a body too large "
                           "for it", hop=hop, observed_bytes=body_bytes, size_error=True)
    if names & (_RESET_NAMES | _TRANSIENT_NAMES):
        return TurnFailure("model", f"network error on {hop}: {type(exc).__name__}", hop=hop, retryable=True)
    return TurnFailure("model", f"unexpected error on {hop}: {type(exc).__name__}", hop=hop)


def failure_brief(failure: TurnFailure) -> dict[str, object]:
    """What may be told about a failure anywhere (events, logs): origin, status and hop; no text,
    which can quote a provider's answer."""
    return {"origin": failure.origin, "status": failure.status, "hop": failure.hop}


def malformed_output(detail: str) -> TurnFailure:
    """The model answered something that is not an assistant message we can act on."""
    return TurnFailure("model", f"malformed model output: {detail}")


def tool_crash(tool: str, exc: BaseException) -> TurnFailure:
    """A tool raised instead of returning a result."""
    return TurnFailure("tool", f"tool {tool} crashed: {type(exc).__name__}: {exc}", hop="harness.tools")


def cancelled() -> TurnFailure:
    return TurnFailure("cancelled", "the turn was cancelled")


def over_ceiling(body_bytes: int, ceiling_bytes: int, detail: str = "") -> TurnFailure:
    """Our side would send a body over the engine ceiling; it is never sent."""
    setting = CEILINGS_BY_KEY["transport_max_body_bytes"].name
    message = (f"the llm-turn body is {body_bytes} bytes, over the engine ceiling "
               f"{setting}={ceiling_bytes} bytes; not sent")
    if detail:
        message += f" ({detail})"
    return TurnFailure("code", message, hop=HOP_ENGINE, limit_bytes=ceiling_bytes, observed_bytes=body_bytes,
                       size_error=True, setting=setting)


# --- the reaction (the loop carries it out) -------------------------------------------------------


class ReactionKind(enum.StrEnum):
    COMPACT_AND_RETRY = "compact_and_retry"  # compact harder, then send the smaller body once more
    RETRY = "retry"  # send the same body again after ``delay_seconds``
    FAIL = "fail"  # the turn fails with this failure (``detail`` added to a size error's message)


@dataclasses.dataclass(frozen=True)
class Reaction:
    kind: ReactionKind
    delay_seconds: float = 0.0
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """Where one llm-turn send stands: the retries it already made, and the policy's bounds."""

    max_model_retries: int
    backoff_seconds: float
    model_retries: int = 0
    size_retries: int = 0
    max_size_retries: int = 1  # compactions and resends after a hop refused the body for its size

    def retried_model(self) -> Attempt:
        return dataclasses.replace(self, model_retries=self.model_retries + 1)

    def retried_size(self) -> Attempt:
        return dataclasses.replace(self, size_retries=self.size_retries + 1)


def retries_spent(failure: TurnFailure, sends: int, attempt: Attempt) -> TurnFailure:
    """The failure that ends a turn after the loop's retries, saying how many requests were sent:
    the one count, so that what is printed is what was made."""
    if not failure.retryable or failure.size_error:
        return failure
    setting = CEILINGS_BY_KEY["model_retry_attempts"].name
    told = (f"{failure.message} ({sends} request{'s' if sends != 1 else ''} sent: {sends - 1} "
            f"retr{'ies' if sends != 2 else 'y'}, {setting}={attempt.max_model_retries})")
    return TurnFailure(failure.origin, told, status=failure.status, hop=failure.hop,
                       limit_bytes=failure.limit_bytes, observed_bytes=failure.observed_bytes,
                       retryable=failure.retryable, setting=failure.setting)


def react(failure: TurnFailure, attempt: Attempt) -> Reaction:
    """The loop's reaction to ``failure`` at ``attempt`` (pure; see the module docstring)."""
    if failure.size_error:
        if attempt.size_retries < attempt.max_size_retries:
            return Reaction(ReactionKind.COMPACT_AND_RETRY)
        return Reaction(ReactionKind.FAIL, detail=_size_retries_said(attempt.size_retries))
    if failure.retryable and attempt.model_retries < attempt.max_model_retries:
        delay = attempt.backoff_seconds * 2 ** attempt.model_retries
        return Reaction(ReactionKind.RETRY, delay_seconds=delay)
    return Reaction(ReactionKind.FAIL)


def _size_retries_said(retries: int) -> str:
    if retries == 0:
        return "(sent once: no compaction and resend after a size failure)"
    return "after compaction and one retry" if retries == 1 else f"after compaction and {retries} retries"
