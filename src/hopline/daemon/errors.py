"""The daemon API's route-level errors, and the one mapping from an agent's failure to one.

Every route that waits on a child (``POST /session``, ``POST /session/{id}/load``) turns what the
child did into an HTTP error through :func:`agent_failure`: a JSON-RPC error is 422
``agent_refused`` (its data echoed up to ``error_data_echo_max_bytes``), an exit 502
``agent_exited``, no answer in time 504 ``agent_timeout``.
"""

from __future__ import annotations

from typing import Any

import orjson

from hopline.budget import CeilingExceeded, HoplineError
from hopline.daemon.child import AgentExited, AgentRpcError


class SessionError(HoplineError):
    """A route-level failure: HTTP status and a JSON error body naming what failed."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"type": kind, "message": message, **extra}}

    @classmethod
    def from_ceiling(cls, status: int, exceeded: CeilingExceeded, kind: str) -> SessionError:
        """A size error, in the one "too large" shape (:meth:`CeilingExceeded.to_json`)."""
        error = cls(status, kind, exceeded.message)
        error.body = {"error": {**exceeded.to_json()["error"], "type": kind}}
        return error


def echoed(data: Any, max_bytes: int) -> Any:
    """An agent's error data as a client may see it: whole up to ``max_bytes``, else its size."""
    if data is None:
        return None
    raw = orjson.dumps(data, default=str)
    return data if len(raw) <= max_bytes else {"omittedBytes": len(raw)}


def agent_failure(exc: BaseException, what: str, *, echo_max_bytes: int) -> SessionError | None:
    """The HTTP error for the agent's failure to answer ``what`` (a method name), or ``None`` when
    ``exc`` is not an agent's failure."""
    if isinstance(exc, AgentRpcError):
        return SessionError(422, "agent_refused", f"the agent refused {what}: {exc.message}",
                            code=exc.code, data=echoed(exc.data, echo_max_bytes))
    if isinstance(exc, AgentExited):
        return SessionError(502, "agent_exited", f"the agent exited during {what} with code {exc.returncode}",
                            reason="agent_exited", exitCode=exc.returncode)
    return None


def agent_timeout(what: str, seconds: float) -> SessionError:
    return SessionError(504, "agent_timeout", f"the agent did not answer {what} within {seconds} s")
