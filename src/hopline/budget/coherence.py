"""Coherence of the ceilings (SPEC B-4): the named checks, :func:`limits_json` (``hopline limits
--json``, the ``budget`` of ``/daemon/status``) and :func:`require_coherent`, which refuses to start
on an error."""

from __future__ import annotations

import dataclasses
from typing import Any

from hopline.budget.ceiling import Unit, format_size
from hopline.budget.settings import SETTINGS, Settings
from hopline.budget.table import CEILINGS, CEILINGS_BY_KEY
from hopline.budget.values import Budget
from hopline.errors import IncoherentBudget


@dataclasses.dataclass(frozen=True)
class CoherenceFinding:
    """One coherence finding: the rule, its severity, the settings involved and a message."""

    rule: str
    severity: str  # "error" | "warning"
    settings: tuple[str, ...]
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "settings": list(self.settings), "message": self.message}


def _names(*keys: str) -> tuple[str, ...]:
    return tuple(CEILINGS_BY_KEY[k].name for k in keys)


def _show(budget: Budget, key: str) -> str:
    ceiling = CEILINGS_BY_KEY[key]
    value = budget.value(key)
    if ceiling.unit is Unit.BYTES:
        return f"{ceiling.name}={int(value)} ({format_size(int(value))})"
    return f"{ceiling.name}={value}"


def check_engine_within_gateway(budget: Budget) -> list[CoherenceFinding]:
    """Error: the engine may build bodies the gateway refuses (the seed's 413)."""
    if budget.transport_max_body_bytes <= budget.api_json_body_limit:
        return []
    keys = ("transport_max_body_bytes", "api_json_body_limit")
    return [CoherenceFinding("engine_within_gateway", "error", _names(*keys),
                    f"engine ceiling {_show(budget, keys[0])} is larger than the gateway limit "
                    f"{_show(budget, keys[1])}: bodies between the two are built and then refused "
                    "with 413")]


def check_sse_event_within_client_reader(budget: Budget) -> list[CoherenceFinding]:
    """Error: the daemon may emit an SSE event the client reader refuses."""
    if budget.sse_max_event_bytes <= budget.client_sse_max_event_bytes:
        return []
    keys = ("sse_max_event_bytes", "client_sse_max_event_bytes")
    return [CoherenceFinding("sse_event_within_client_reader", "error", _names(*keys),
                    f"the daemon may emit an SSE event of {_show(budget, keys[0])}, over the client "
                    f"reader limit {_show(budget, keys[1])}")]


def worst_case_iteration_bytes(budget: Budget) -> int:
    """One loop iteration's worst case: every call's arguments and every capped result."""
    calls = budget.tool_calls_per_iteration_max
    return calls * (budget.tool_result_max_bytes + budget.tool_arguments_max_bytes)


def check_iteration_fits_engine(budget: Budget) -> list[CoherenceFinding]:
    """Warning: one iteration appended to a history at the trigger must still fit the ceiling."""
    room = int(budget.transport_max_body_bytes * (1 - budget.compaction_threshold))
    worst = worst_case_iteration_bytes(budget)
    if worst <= room:
        return []
    keys = ("tool_calls_per_iteration_max", "tool_result_max_bytes", "tool_arguments_max_bytes",
            "transport_max_body_bytes")
    return [CoherenceFinding("iteration_fits_engine", "warning", _names(*keys),
                    f"one iteration can add {worst} bytes ({_show(budget, keys[0])} x "
                    f"({_show(budget, keys[1])} + {_show(budget, keys[2])})) but only {room} bytes "
                    f"are left above the compaction trigger under {_show(budget, keys[3])}")]


def check_summarization_fits_engine(budget: Budget) -> list[CoherenceFinding]:
    """Error: a summarization request must itself fit under the engine ceiling."""
    request = budget.summary_chunk_bytes + budget.summary_request_overhead_bytes
    if request <= budget.transport_max_body_bytes:
        return []
    keys = ("summary_chunk_bytes", "summary_request_overhead_bytes", "transport_max_body_bytes")
    return [CoherenceFinding("summarization_fits_engine", "error", _names(*keys),
                    f"a summarization request of {_show(budget, keys[0])} plus "
                    f"{_show(budget, keys[1])} does not fit {_show(budget, keys[2])}")]


def check_stream_carries_response(budget: Budget) -> list[CoherenceFinding]:
    """Error: a streamed answer at the response ceiling must fit the stream's raw ceiling."""
    keys = ("provider_response_max_bytes", "provider_stream_max_bytes")
    if budget.provider_stream_max_bytes >= budget.provider_response_max_bytes:
        return []
    return [CoherenceFinding("stream_carries_response", "error", _names(*keys),
                    f"{_show(budget, keys[1])} is below {_show(budget, keys[0])}: an answer the response "
                    "ceiling accepts is cut while it streams")]


def check_pipe_ends_agree(budget: Budget) -> list[CoherenceFinding]:
    """Error: both ends of the ACP pipe must read with the same max frame."""
    if budget.pipe_max_frame_bytes == budget.agent_max_frame_bytes:
        return []
    keys = ("pipe_max_frame_bytes", "agent_max_frame_bytes")
    return [CoherenceFinding("pipe_ends_agree", "error", _names(*keys),
                    f"the daemon reads the pipe with {_show(budget, keys[0])} but the agent reads "
                    f"with {_show(budget, keys[1])}: a frame accepted by one end is torn down by the "
                    "other")]


def check_sidecar_quotas_nested(budget: Budget) -> list[CoherenceFinding]:
    """Error: object <= session <= store, or a quota can never be used."""
    keys = ("sidecar_max_object_bytes", "sidecar_max_session_bytes", "sidecar_max_store_bytes")
    a, b, c = (budget.value(k) for k in keys)
    if a <= b <= c:
        return []
    return [CoherenceFinding("sidecar_quotas_nested", "error", _names(*keys),
                    f"sidecar quotas must nest: {', '.join(_show(budget, k) for k in keys)}")]


def check_sidecar_under_large_frame(budget: Budget) -> list[CoherenceFinding]:
    """Warning: a sidecar threshold at or over the large-frame threshold lets big frames through."""
    keys = ("sidecar_threshold_bytes", "large_frame_threshold_bytes")
    if budget.sidecar_threshold_bytes < budget.large_frame_threshold_bytes:
        return []
    return [CoherenceFinding("sidecar_under_large_frame", "warning", _names(*keys),
                    f"{_show(budget, keys[0])} is not below {_show(budget, keys[1])}: tool output "
                    "frames can reach the large-frame threshold before moving to a sidecar")]


def check_sidecar_stub_within_sse_event(budget: Budget) -> list[CoherenceFinding]:
    """Error: a stubbed update must fit an SSE event."""
    keys = ("sidecar_threshold_bytes", "sse_max_event_bytes")
    if budget.sidecar_threshold_bytes < budget.sse_max_event_bytes:
        return []
    return [CoherenceFinding("sidecar_stub_within_sse_event", "error", _names(*keys),
                    f"{_show(budget, keys[0])} must be below {_show(budget, keys[1])}")]


# A subscriber's queue holds at least this many events of the largest inline size (an update over
# the sidecar threshold has its fields moved to sidecars): a client that keeps up on average is then
# not evicted by a burst of a few such events (SPEC D-4; the default holds 32).
SSE_QUEUE_MIN_LARGEST_EVENTS = 4


def check_sse_queue_holds_largest_events(budget: Budget) -> list[CoherenceFinding]:
    """Warning: a subscriber's queue that holds only a few of the largest inline events evicts a
    client that keeps up on average, at the first burst of them."""
    keys = ("sse_queue_max_bytes", "sidecar_threshold_bytes")
    if budget.sse_queue_max_bytes >= SSE_QUEUE_MIN_LARGEST_EVENTS * budget.sidecar_threshold_bytes:
        return []
    return [CoherenceFinding("sse_queue_holds_largest_events", "warning", _names(*keys),
                    f"{_show(budget, keys[0])} holds fewer than {SSE_QUEUE_MIN_LARGEST_EVENTS} events "
                    f"of the largest inline size ({_show(budget, keys[1])}): a client that keeps up on "
                    "average is evicted as a slow client by a burst of them")]


COHERENCE_CHECKS = (
    check_engine_within_gateway,
    check_sse_event_within_client_reader,
    check_iteration_fits_engine,
    check_summarization_fits_engine,
    check_pipe_ends_agree,
    check_sidecar_quotas_nested,
    check_sidecar_under_large_frame,
    check_sidecar_stub_within_sse_event,
    check_sse_queue_holds_largest_events,
    check_stream_carries_response,
)


def check_coherence(budget: Budget) -> list[CoherenceFinding]:
    """Run every named coherence check; errors first."""
    findings = [f for check in COHERENCE_CHECKS for f in check(budget)]
    return sorted(findings, key=lambda f: f.severity != "error")


def limits_json(budget: Budget, findings: list[CoherenceFinding],
                settings: Settings | None = None) -> dict[str, object]:
    """Every ceiling in force, where it came from, and the coherence findings: `hopline limits --json`
    and the ``budget`` of ``GET /daemon/status``; with ``settings``, the :data:`SETTINGS` too (shown
    without secrets)."""
    ceilings: list[dict[str, object]] = []
    for c in CEILINGS:
        row: dict[str, object] = {"name": c.name, "hop": c.hop}
        if c.unit is Unit.BYTES:
            row["bytes"] = budget.value(c.key)
        else:
            row["value"] = budget.value(c.key)
            row["unit"] = c.unit.value
        row["source"] = budget.source(c.key)
        ceilings.append(row)
    doc: dict[str, object] = {
        "ceilings": ceilings,
        "narrowestRequestCeiling": budget.narrowest_request_ceiling().name,
        "errors": [f.to_json() for f in findings if f.severity == "error"],
        "warnings": [f.to_json() for f in findings if f.severity == "warning"],
    }
    if settings is not None:
        doc["settings"] = [{"name": s.name, "option": s.option, "value": settings.shown(s.key),
                            "source": settings.source(s.key)} for s in SETTINGS]
    return doc


def require_coherent(budget: Budget) -> list[CoherenceFinding]:
    """Raise :class:`IncoherentBudget` on any error; return the warnings."""
    findings = check_coherence(budget)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise IncoherentBudget(errors)
    return findings
