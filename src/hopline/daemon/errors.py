"""The daemon API's route-level errors, and the one mapping from an agent's failure to one.

Every route that waits on a child (``POST /session``, ``POST /session/{id}/load``) turns what the
child did into an HTTP error through :func:`agent_failure`: a JSON-RPC error is 422
``agent_refused`` (its message echoed up to ``error_message_echo_max_bytes``, its data up to
``error_data_echo_max_bytes``: the agent's words are bounded like any input), an exit 502
``agent_exited``, no answer in time 504 ``agent_timeout``.
"""

from __future__ import annotations

from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, Budget, HoplineError, LimitExceeded
from hopline.daemon.child import AgentExited, AgentRpcError


class SessionError(HoplineError):
    """A route-level failure: HTTP status and a JSON error body naming what failed."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"type": kind, "message": message, **extra}}

    @classmethod
    def from_limit(cls, status: int, exceeded: LimitExceeded, kind: str) -> SessionError:
        """A limit passed, a size or a count, in the one shape (:meth:`LimitExceeded.to_json`)."""
        error = cls(status, kind, exceeded.message)
        error.body = {"error": {**exceeded.to_json()["error"], "type": kind}}
        return error

    @classmethod
    def over_limit(cls, status: int, kind: str, key: str, limit: int | float, observed: int | float,
                   message: str, *, hop: str, **extra: Any) -> SessionError:
        """The budget ceiling ``key`` refused this (:meth:`hopline.budget.Ceiling.exceeded`)."""
        return cls.from_limit(status, CEILINGS_BY_KEY[key].exceeded(limit, observed, message, hop=hop,
                                                                    **extra), kind)


def echoed(data: Any, max_bytes: int) -> Any:
    """An agent's error data as a client may see it: whole up to ``max_bytes``, else its size."""
    if data is None:
        return None
    raw = orjson.dumps(data, default=str)
    return data if len(raw) <= max_bytes else {"omittedBytes": len(raw)}


def echoed_message(message: str, max_bytes: int) -> tuple[str, int]:
    """An agent's error message as a client may see it: whole up to ``max_bytes`` UTF-8 bytes, else
    its head that fits (never a split character); and the bytes left out (0 when whole)."""
    raw = message.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return message, 0
    head = raw[:max_bytes].decode("utf-8", "ignore")
    return head, len(raw) - len(head.encode("utf-8"))


def agent_failure(exc: BaseException, what: str, budget: Budget) -> SessionError | None:
    """The HTTP error for the agent's failure to answer ``what`` (a method name), or ``None`` when
    ``exc`` is not an agent's failure."""
    if isinstance(exc, AgentRpcError):
        message, omitted = echoed_message(exc.message, budget.error_message_echo_max_bytes)
        extra: dict[str, Any] = {"omittedMessageBytes": omitted} if omitted else {}
        shown = f"{message} … ({omitted} more bytes)" if omitted else message
        return SessionError(422, "agent_refused", f"the agent refused {what}: {shown}", code=exc.code,
                            data=echoed(exc.data, budget.error_data_echo_max_bytes), **extra)
    if isinstance(exc, AgentExited):
        return SessionError(502, "agent_exited", f"the agent exited during {what} with code {exc.returncode}",
                            reason="agent_exited", exitCode=exc.returncode)
    return None


def agent_timeout(what: str, seconds: float) -> SessionError:
    return SessionError(504, "agent_timeout", f"the agent did not answer {what} within {seconds} s")
