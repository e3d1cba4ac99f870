"""hopline's errors, whole: the hops every error names, the tree, and the one shape of a limit passed.

The tree (every exception hopline raises on purpose derives from :class:`HoplineError`;
``tests/test_error_tree.py`` walks the package)::

    HoplineError
    ├── ConfigError            a setting hopline cannot use; the message names the variable
    │   ├── BudgetError · IncoherentBudget · StoreSettingError · ProviderSettingError
    ├── LimitExceeded          a payload or a count passed a limit of the budget (SPEC D-10)
    │   └── SseEventTooLarge
    ├── InputError             what a client or a peer sent is refused before use (a 4xx)
    │   └── InputRefused · RepoError
    ├── StoreError             where state lives failed, or holds what this hopline cannot read
    │   ├── StoreUnavailable ─ StoreBusy · StoreDamaged · ObjectStoreUnavailable
    │   └── DataDirBusy · KeyTaken · KeyRecordDamaged · SidecarWriterError
    ├── AgentError             an agent child, its model or its tools failed
    │   └── TurnFailure · ToolError · GitError
    ├── ClusterError           several daemons on one store (SPEC X)
    │   └── LeaseLost
    ├── ClientError            the SDK's side of the daemon API
    │   └── DaemonError · SseReconnectExhausted · SidecarIntegrityError · EmbeddedStackError
    └── InternalError          a rule of hopline's own broken: a bug, never input (answered as a 500)

A class lives here when more than one package names it (raises, catches or subclasses it); one that
a single package uses stays in that package, under the middle base it belongs to
(``tests/test_error_tree.py`` holds both rules).

Every limit any hop enforces, a byte size or a count, is refused with one :class:`LimitExceeded`,
built by :meth:`hopline.budget.Ceiling.exceeded` (the ceiling names its setting, its hop and its
unit), so a client handles "over a limit" once::

    {"error": {"type", "hop", "setting", "limit", "observed", "unit", "message", ...}}

This module imports nothing of ours: it is the bottom of every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

# --- the hops, as SPEC's diagram names them, in every error a hop answers with ----------------------
HOP_DAEMON_API = "daemon.api"
HOP_DAEMON_SSE = "daemon.sse"
HOP_CLIENT_SSE = "client.sse"
HOP_PIPE = "acp.pipe"
HOP_ENGINE = "engine.llm_turn"
HOP_GATEWAY = "gateway.llm_turn"
HOP_PROVIDER = "gateway.provider"
HOP_CONTEXT = "harness.context"
HOP_TOOLS = "harness.tools"
HOP_REPLAY = "daemon.replay"
HOP_JOURNAL = "daemon.journal"
HOP_SIDECARS = "daemon.sidecars"
HOP_OBSERVE = "observe.large_frames"
HOP_GATE = "daemon.gate"
HOP_CLUSTER = "daemon.cluster"  # daemon <-> store and daemon <-> daemon (SPEC X)

UNIT_BYTES = "bytes"


class HoplineError(Exception):
    """The base of every error hopline raises on purpose."""


# --- configuration -------------------------------------------------------------------------------


class ConfigError(HoplineError, ValueError):
    """A setting hopline cannot use; the message names the variable to fix (never a secret)."""


class BudgetError(ConfigError):
    """A setting could not be read; the message names the variable and the value."""


class _Finding(Protocol):  # a coherence finding (hopline.budget.CoherenceFinding)
    @property
    def rule(self) -> str: ...

    @property
    def message(self) -> str: ...


class IncoherentBudget(ConfigError):
    """The chain of ceilings is incoherent (SPEC B-4); a component refuses to start."""

    def __init__(self, errors: Sequence[_Finding]) -> None:
        self.errors = list(errors)
        super().__init__("incoherent budget: " + "; ".join(f.message for f in errors))


class StoreSettingError(ConfigError):
    """A store or sidecar URL that hopline cannot use; the message names the setting."""


class ProviderSettingError(ConfigError):
    """A provider setting could not be used; the message names the variable, never a value."""


# --- limits --------------------------------------------------------------------------------------


class LimitExceeded(HoplineError):
    """A payload or a count passed a limit of the budget, on one hop.

    ``setting`` is the limit's public name (its env var); ``observed`` is the size or count seen, a
    lower bound when a payload was cut off as soon as it passed the limit. :meth:`to_json` is the
    one JSON shape of "over a limit" on every hop; :meth:`fields` its limit keys, which an event
    that reports a limit passed (``frame_dropped``, a dropped update's ``_meta``) carries too.
    """

    def __init__(self, hop: str, setting: str, limit: int | float, observed: int | float,
                 message: str | None = None, *, unit: str = UNIT_BYTES, kind: str = "ceiling_exceeded",
                 **extra: Any) -> None:
        self.hop = hop
        self.setting = setting
        self.limit = limit
        self.observed = observed
        self.unit = unit
        self.kind = kind
        self.extra = extra
        self.message = message or (f"{hop}: {observed} {unit} exceed the limit of {limit} {unit} "
                                   f"({setting})")
        super().__init__(self.message)

    def fields(self) -> dict[str, Any]:
        """The limit fields every rendering carries (an error body, an event, a JSON-RPC error)."""
        return {"hop": self.hop, "setting": self.setting, "limit": self.limit, "observed": self.observed,
                "unit": self.unit}

    def limit_fields(self) -> dict[str, Any]:
        """:meth:`fields` without the hop, for an error body that names its hop itself."""
        return {key: value for key, value in self.fields().items() if key != "hop"}

    def to_json(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, **self.fields(), "message": self.message, **self.extra}}


class SseEventTooLarge(LimitExceeded):
    """An SSE event passed the reader's limit; nothing past the limit was buffered."""


# --- input ---------------------------------------------------------------------------------------


class InputError(HoplineError, ValueError):
    """What a client or a peer sent is refused before use: answered with a 4xx, never a 500."""


class InputRefused(InputError):
    """Client input refused before use: ``kind`` names the rule, ``fields`` the numbers seen."""

    def __init__(self, kind: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.fields = fields


class RepoError(InputError):
    """The repository or a revision cannot be used; the message says which, never a path."""


# --- where state lives ---------------------------------------------------------------------------


class StoreError(HoplineError):
    """The store failed, or holds what this hopline cannot read. ``hop`` is the one a route names."""

    hop = HOP_CLUSTER


class StoreUnavailable(StoreError, RuntimeError):
    """The store could not be reached or used; the message never holds its URL."""


class StoreBusy(StoreUnavailable):
    """A row this statement needs is locked by another daemon's transaction (perhaps a frozen one,
    which PostgreSQL ends once it stays idle past ``HOPLINE_STORE_IDLE_TRANSACTION_SECONDS``)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreDamaged(StoreUnavailable):
    """The store cannot be used as it is; the message names the file and the next step."""


class ObjectStoreUnavailable(StoreUnavailable, OSError):
    """The object store failed, could not be reached, or did not answer within
    ``HOPLINE_OBJECT_STORE_TIMEOUT``. An ``OSError``, so the sidecar store refuses the write (the
    update goes out degraded, ``object_store_unavailable``); a :class:`StoreUnavailable`, so a route
    answers 503 with ``Retry-After``. The message names neither the bucket nor a key."""

    hop = HOP_SIDECARS

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DataDirBusy(StoreError):
    """Another live hopline daemon holds the data directory's lock: the message names it (its pid and
    URL) and what to do; ``holder`` is what its lock file says."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


class KeyTaken(StoreError):
    """Another write stored this idempotency key (and what it created) first: this one was not
    applied."""

    def __init__(self) -> None:
        super().__init__("another request with this idempotency key was stored first")


class KeyRecordDamaged(StoreError):
    """A stored idempotency key's bytes fail their checksum: its answer cannot be given, nor the write
    run again."""

    def __init__(self) -> None:
        super().__init__("the stored idempotency record fails its checksum")


class SidecarWriterError(StoreError, RuntimeError):
    """The sidecar directory an agent was given holds no store (a misconfigured spawn)."""

    hop = HOP_SIDECARS


# --- agents, their model and their tools ---------------------------------------------------------


class AgentError(HoplineError):
    """An agent child, its model or one of its tools failed."""


Origin = Literal["code", "model", "tool", "cancelled"]
# The ``type`` of a turn failure's JSON: a body too large for a hop (the loop compacts and retries
# once), or any other failure.
TURN_FAILURE = "turn_failure"
BODY_TOO_LARGE = "body_too_large"


class TurnFailure(AgentError):
    """A failed model call or turn, with its origin (SPEC H-8).

    ``size_error`` marks code-origin failures caused by a body too large for a hop (413, a reset
    while uploading, a context-length error): the loop compacts and retries once. ``retryable``
    marks transient model-origin failures (429, 5xx, timeouts): the loop retries with backoff.
    """

    def __init__(
        self,
        origin: Origin,
        message: str,
        *,
        status: int | None = None,
        hop: str | None = None,
        limit_bytes: int | None = None,
        observed_bytes: int | None = None,
        size_error: bool = False,
        retryable: bool = False,
        setting: str | None = None,
    ) -> None:
        super().__init__(message)
        self.origin: Origin = origin
        self.message = message
        self.status = status
        self.hop = hop
        self.limit_bytes = limit_bytes
        self.observed_bytes = observed_bytes
        self.size_error = size_error
        self.retryable = retryable
        self.setting = setting  # the budget setting of the ceiling a size error passed, when known

    def fields(self) -> dict[str, Any]:
        """What may travel of the failure (the gateway's error, the agent's JSON-RPC error data, a
        ``turn_error``): its origin and message, then what is known of ``status``, ``hop`` and
        ``setting``, and a byte limit's ``limit``, ``observed`` and ``unit`` (the one limit shape)."""
        fields: dict[str, Any] = {"origin": self.origin, "message": self.message}
        for key, value in (("status", self.status), ("hop", self.hop), ("setting", self.setting),
                           ("limit", self.limit_bytes), ("observed", self.observed_bytes)):
            if value is not None:
                fields[key] = value
        if self.limit_bytes is not None or self.observed_bytes is not None:
            fields["unit"] = UNIT_BYTES
        if self.retryable:
            fields["retryable"] = True
        return fields

    def to_json(self) -> dict[str, Any]:
        """The JSON error shape shared by the gateway and the harness."""
        return {"error": {"type": BODY_TOO_LARGE if self.size_error else TURN_FAILURE, **self.fields()}}


class ToolError(AgentError):
    """An expected tool failure: its message goes to the model as a failed result."""


class GitError(AgentError):
    """git failed, timed out, or is missing; the message holds git's own first line (no payload)."""


# --- several daemons -----------------------------------------------------------------------------


class ClusterError(HoplineError):
    """Several daemons on one store (SPEC X): what one daemon may no longer do."""


class LeaseLost(ClusterError):
    """This daemon no longer owns these sessions: their events were not written."""

    def __init__(self, session_ids: Sequence[str]) -> None:
        super().__init__(f"the lease of {len(session_ids)} session(s) was taken by another daemon")
        self.session_ids = tuple(session_ids)


# --- the client's side ---------------------------------------------------------------------------


class ClientError(HoplineError):
    """The SDK's side of the daemon API: an error answer, a stream lost, a sidecar not as declared,
    an embedded daemon that did not start."""


class DaemonError(ClientError):
    """The daemon answered an API call with an error status (0: no answer at all)."""

    def __init__(self, status: int, body: Any, method: str, route: str) -> None:
        self.status = status
        self.body = body
        self.retry_after: float | None = None  # the answer's Retry-After, in seconds
        # The daemon answers {"error": {"type", "hop", "message", ...}}; a limit passed adds
        # "setting", "limit", "observed", "unit" (LimitExceeded).
        error = body.get("error") if isinstance(body, dict) else None
        fields: dict[str, Any] = error if isinstance(error, dict) else body if isinstance(body, dict) else {}
        self.hop = str(fields.get("hop") or HOP_DAEMON_API)
        self.type = fields.get("type")
        detail = fields.get("message") or fields.get("detail") or (fields or body)
        unit = f" {fields['unit']}" if isinstance(fields.get("unit"), str) else ""
        sizes = "".join(f", {key} {fields[key]}{unit}" for key in ("limit", "observed") if key in fields)
        # Named, not super(): a subclass may also be a LimitExceeded (the client's RequestTooLarge).
        answered = f" -> {status}" if status else ""  # 0: no answer at all (a transport failure)
        HoplineError.__init__(self, f"hop {self.hop}: {method} {route}{answered}: {detail}{sizes}")


class SseReconnectExhausted(ClientError):
    """The event stream dropped and every reconnect attempt failed."""

    def __init__(self, attempts: int, last_event_id: int | None, cause: BaseException) -> None:
        self.attempts = attempts
        self.last_event_id = last_event_id
        super().__init__(f"hop {HOP_CLIENT_SSE}: event stream lost after {attempts} reconnect attempts "
                         f"(last event id {last_event_id}): {type(cause).__name__}: {cause}")


class SidecarIntegrityError(ClientError):
    """A fetched sidecar does not match its declared size or sha256."""

    def __init__(self, sidecar_id: str, message: str) -> None:
        self.sidecar_id = sidecar_id
        super().__init__(f"hop {HOP_SIDECARS}: sidecar {sidecar_id}: {message}")


class EmbeddedStackError(ClientError, RuntimeError):
    """The embedded daemon did not start; the message carries the tail of its stderr."""


# --- hopline's own rules -------------------------------------------------------------------------


class InternalError(HoplineError):
    """A rule of hopline's own was broken (a transition a table forbids, a plan that breaks an
    invariant): a bug in hopline, never input. Nothing answers it on purpose: an HTTP route's last
    resort answers 500 ``internal_error`` with an ``incidentId``."""
