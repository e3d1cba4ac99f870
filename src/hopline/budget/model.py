""":class:`Budget`: every hop's model gathered, the values in force, and the coherence rules (SPEC
B-4) as its model validators: a budget knows its findings from the moment it is built."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from pydantic import PrivateAttr, ValidationError, model_validator

from hopline.budget.ceiling import Ceiling, Unit, format_size
from hopline.budget.declare import budget_error
from hopline.budget.hops import (
    ClientSseLimits,
    ClusterLimits,
    ContextLimits,
    DaemonApiLimits,
    DaemonSseLimits,
    EngineLimits,
    GateLimits,
    GatewayLimits,
    JournalLimits,
    ObserveLimits,
    PipeLimits,
    ProviderLimits,
    ReplayLimits,
    SidecarLimits,
    ToolLimits,
)
from hopline.budget.table import CEILINGS, CEILINGS_BY_KEY, FIXED, REQUEST_PATH

_FIXED_KEYS = frozenset(c.key for c in FIXED)


@dataclasses.dataclass(frozen=True)
class CoherenceFinding:
    """One coherence finding: the rule, its severity, the settings involved and a message."""

    rule: str
    severity: str  # "error" | "warning"
    settings: tuple[str, ...]
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "settings": list(self.settings), "message": self.message}


COHERENCE_RULES: list[str] = []  # the rules' names, in the order they run


def coherence(severity: str, *keys: str) -> Callable[[Callable[[Budget], str | None]], Any]:
    """A coherence rule over the settings ``keys``: a model validator of :class:`Budget` that records
    a finding when the check returns its message (a finding never refuses the budget: a component
    that runs it asks :func:`~hopline.budget.require_coherent`)."""
    names = tuple(CEILINGS_BY_KEY[key].name for key in keys)

    def rule(check: Callable[[Budget], str | None]) -> Any:
        def validate(budget: Budget) -> Budget:
            message = check(budget)
            if message is not None:
                budget._findings.append(CoherenceFinding(check.__name__, severity, names, message))
            return budget

        validate.__name__, validate.__doc__ = check.__name__, check.__doc__
        COHERENCE_RULES.append(check.__name__)
        return model_validator(mode="after")(validate)

    return rule


# A subscriber's queue holds at least this many events of the largest inline size (an update over
# the sidecar threshold has its fields moved to sidecars): a client that keeps up on average is then
# not evicted by a burst of a few such events (SPEC D-4; the default holds 32).
SSE_QUEUE_MIN_LARGEST_EVENTS = 4


class Budget(DaemonApiLimits, DaemonSseLimits, ClientSseLimits, ReplayLimits, PipeLimits, ObserveLimits,
             EngineLimits, GatewayLimits, ProviderLimits, ContextLimits, ToolLimits, JournalLimits,
             SidecarLimits, ClusterLimits, GateLimits):
    """Every hop's settings in force (``budget.<key>``), where each came from, and the findings."""

    _findings: list[CoherenceFinding] = PrivateAttr(default_factory=list)

    @classmethod
    @functools.cache
    def defaults(cls) -> Budget:
        return cls.model_validate({})

    def replace(self, **changes: int | float) -> Budget:
        """A copy with ``changes`` (validated, the rules run again); their source is ``override``. A
        fixed value may be replaced here only: by code (a command's option, a test), never a variable."""
        unknown = sorted(set(changes) - set(type(self).model_fields) - _FIXED_KEYS)
        if unknown:
            raise TypeError(f"no such setting or fixed value: {', '.join(unknown)}")
        fixed = {key: type(CEILINGS_BY_KEY[key].default)(value) for key, value in changes.items()
                 if key in _FIXED_KEYS}
        for key in fixed:
            CEILINGS_BY_KEY[key].validate(fixed[key])
        context = {"fixed": {**self._fixed, **fixed},
                   "sources": {**self._sources, **dict.fromkeys(changes, "override")}}
        fields = {key: value for key, value in changes.items() if key not in _FIXED_KEYS}
        try:
            return type(self).model_validate({**self.model_dump(), **fields}, context=context)
        except ValidationError as exc:
            raise budget_error(exc, type(self), fields) from None

    def value(self, key: str) -> int | float:
        value: int | float = getattr(self, key)
        return value

    @property
    def findings(self) -> list[CoherenceFinding]:
        """The coherence findings of these values, errors first."""
        return sorted(self._findings, key=lambda f: f.severity != "error")

    def narrowest_request_ceiling(self) -> Ceiling:
        return min((CEILINGS_BY_KEY[k] for k in REQUEST_PATH), key=lambda c: self.value(c.key))

    def to_env(self) -> dict[str, str]:
        """Variables that reproduce every value not at its default (handed to child processes)."""
        return {c.env: str(self.value(c.key)) for c in CEILINGS
                if c.env is not None and c.key in self._sources}

    def shown(self, key: str) -> str:
        """``NAME=value`` as a finding says it (a byte size with its human units too)."""
        ceiling, value = CEILINGS_BY_KEY[key], self.value(key)
        if ceiling.unit is Unit.BYTES:
            return f"{ceiling.name}={int(value)} ({format_size(int(value))})"
        return f"{ceiling.name}={value}"

    # --- the coherence rules (SPEC B-4), run in this order ---------------------------------------

    @coherence("error", "transport_max_body_bytes", "api_json_body_limit")
    def engine_within_gateway(self) -> str | None:
        """The engine may build bodies the gateway refuses (the seed's 413)."""
        if self.transport_max_body_bytes <= self.api_json_body_limit:
            return None
        return (f"engine ceiling {self.shown('transport_max_body_bytes')} is larger than the gateway limit "
                f"{self.shown('api_json_body_limit')}: bodies between the two are built and then refused "
                "with 413")

    @coherence("error", "sse_max_event_bytes", "client_sse_max_event_bytes")
    def sse_event_within_client_reader(self) -> str | None:
        """The daemon may emit an SSE event the client reader refuses."""
        if self.sse_max_event_bytes <= self.client_sse_max_event_bytes:
            return None
        return (f"the daemon may emit an SSE event of {self.shown('sse_max_event_bytes')}, over the client "
                f"reader limit {self.shown('client_sse_max_event_bytes')}")

    @coherence("warning", "tool_calls_per_iteration_max", "tool_result_max_bytes", "tool_arguments_max_bytes",
               "transport_max_body_bytes")
    def iteration_fits_engine(self) -> str | None:
        """One iteration appended to a history at the compaction trigger must still fit the ceiling."""
        room = int(self.transport_max_body_bytes * (1 - self.compaction_threshold))
        worst = self.worst_case_iteration_bytes()
        if worst <= room:
            return None
        return (f"one iteration can add {worst} bytes ({self.shown('tool_calls_per_iteration_max')} x "
                f"({self.shown('tool_result_max_bytes')} + {self.shown('tool_arguments_max_bytes')})) but "
                f"only {room} bytes are left above the compaction trigger under "
                f"{self.shown('transport_max_body_bytes')}")

    @coherence("error", "summary_chunk_bytes", "summary_request_overhead_bytes", "transport_max_body_bytes")
    def summarization_fits_engine(self) -> str | None:
        """A summarization request must itself fit under the engine ceiling."""
        if self.summary_chunk_bytes + self.summary_request_overhead_bytes <= self.transport_max_body_bytes:
            return None
        return (f"a summarization request of {self.shown('summary_chunk_bytes')} plus "
                f"{self.shown('summary_request_overhead_bytes')} does not fit "
                f"{self.shown('transport_max_body_bytes')}")

    @coherence("error", "pipe_max_frame_bytes", "agent_max_frame_bytes")
    def pipe_ends_agree(self) -> str | None:
        """Both ends of the ACP pipe must read with the same max frame."""
        if self.pipe_max_frame_bytes == self.agent_max_frame_bytes:
            return None
        return (f"the daemon reads the pipe with {self.shown('pipe_max_frame_bytes')} but the agent reads "
                f"with {self.shown('agent_max_frame_bytes')}: a frame accepted by one end is torn down by "
                "the other")

    @coherence("error", "sidecar_max_object_bytes", "sidecar_max_session_bytes", "sidecar_max_store_bytes")
    def sidecar_quotas_nested(self) -> str | None:
        """object <= session <= store, or a quota can never be used."""
        if self.sidecar_max_object_bytes <= self.sidecar_max_session_bytes <= self.sidecar_max_store_bytes:
            return None
        keys = ("sidecar_max_object_bytes", "sidecar_max_session_bytes", "sidecar_max_store_bytes")
        return f"sidecar quotas must nest: {', '.join(self.shown(k) for k in keys)}"

    @coherence("warning", "sidecar_threshold_bytes", "large_frame_threshold_bytes")
    def sidecar_under_large_frame(self) -> str | None:
        """A sidecar threshold at or over the large-frame threshold lets big frames through."""
        if self.sidecar_threshold_bytes < self.large_frame_threshold_bytes:
            return None
        return (f"{self.shown('sidecar_threshold_bytes')} is not below "
                f"{self.shown('large_frame_threshold_bytes')}: tool output frames can reach the large-frame "
                "threshold before moving to a sidecar")

    @coherence("error", "sidecar_threshold_bytes", "sse_max_event_bytes")
    def sidecar_stub_within_sse_event(self) -> str | None:
        """A stubbed update must fit an SSE event."""
        if self.sidecar_threshold_bytes < self.sse_max_event_bytes:
            return None
        return f"{self.shown('sidecar_threshold_bytes')} must be below {self.shown('sse_max_event_bytes')}"

    @coherence("warning", "sse_queue_max_bytes", "sidecar_threshold_bytes")
    def sse_queue_holds_largest_events(self) -> str | None:
        """A subscriber's queue that holds only a few of the largest inline events evicts a client that
        keeps up on average, at the first burst of them."""
        if self.sse_queue_max_bytes >= SSE_QUEUE_MIN_LARGEST_EVENTS * self.sidecar_threshold_bytes:
            return None
        return (f"{self.shown('sse_queue_max_bytes')} holds fewer than {SSE_QUEUE_MIN_LARGEST_EVENTS} "
                f"events of the largest inline size ({self.shown('sidecar_threshold_bytes')}): a client that "
                "keeps up on average is evicted as a slow client by a burst of them")

    @coherence("error", "provider_response_max_bytes", "provider_stream_max_bytes")
    def stream_carries_response(self) -> str | None:
        """A streamed answer at the response ceiling must fit the stream's raw ceiling."""
        if self.provider_stream_max_bytes >= self.provider_response_max_bytes:
            return None
        return (f"{self.shown('provider_stream_max_bytes')} is below "
                f"{self.shown('provider_response_max_bytes')}: an answer the response ceiling accepts is cut "
                "while it streams")

    def worst_case_iteration_bytes(self) -> int:
        """One loop iteration's worst case: every call's arguments and every capped result."""
        calls = self.tool_calls_per_iteration_max
        return calls * (self.tool_result_max_bytes + self.tool_arguments_max_bytes)

