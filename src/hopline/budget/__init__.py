"""The budget (SPEC B): every hop's ceilings and the settings, one concern per module.

- :mod:`.ceiling`: one row (:class:`Ceiling`, :class:`Unit`) and the byte sizes settings are written in;
- :mod:`.table`: the rows (:data:`CEILINGS`) and the hops they guard;
- :mod:`.values`: :class:`Budget`, the values in force, read from the environment;
- :mod:`.settings`: the settings that are not ceilings (store, sidecars, cluster), :func:`redact_url`;
- :mod:`.coherence`: the coherence checks (B-4), :func:`limits_json`, :func:`require_coherent`.

Every public name is re-exported here, so ``from hopline.budget import X`` serves every caller; the
modules of this package import each other, never this one (no import circle). The package imports
nothing of ours but the error tree.
"""

# The error tree's root and the one limit shape live in hopline.errors; re-exported here, so
# ``from hopline.budget import HoplineError`` keeps working.
from hopline.budget.ceiling import (
    MAX_SIZE_BYTES,
    Ceiling,
    GiB,
    KiB,
    MiB,
    Unit,
    format_size,
    parse_size,
)
from hopline.budget.coherence import (
    COHERENCE_CHECKS,
    CoherenceFinding,
    check_coherence,
    check_engine_within_gateway,
    check_iteration_fits_engine,
    check_pipe_ends_agree,
    check_sidecar_quotas_nested,
    check_sidecar_stub_within_sse_event,
    check_sidecar_under_large_frame,
    check_sse_event_within_client_reader,
    check_sse_queue_holds_largest_events,
    check_stream_carries_response,
    check_summarization_fits_engine,
    limits_json,
    require_coherent,
    worst_case_iteration_bytes,
)
from hopline.budget.settings import (
    SECRET_SETTINGS_ENV,
    SETTINGS,
    SETTINGS_BY_KEY,
    Setting,
    Settings,
    redact_url,
)
from hopline.budget.table import (
    CEILINGS,
    CEILINGS_BY_KEY,
    HOP_CLIENT_SSE,
    HOP_CLUSTER,
    HOP_CONTEXT,
    HOP_DAEMON_API,
    HOP_DAEMON_SSE,
    HOP_ENGINE,
    HOP_GATE,
    HOP_GATEWAY,
    HOP_JOURNAL,
    HOP_OBSERVE,
    HOP_PIPE,
    HOP_PROVIDER,
    HOP_REPLAY,
    HOP_SIDECARS,
    HOP_TOOLS,
    MAX_QUEUED_RANGE,
    REQUEST_PATH,
    SCRIPTED_SEED_RANGE,
)
from hopline.budget.values import (
    Budget,
)
from hopline.errors import BudgetError, HoplineError, IncoherentBudget, LimitExceeded

__all__ = [
    "CEILINGS",
    "CEILINGS_BY_KEY",
    "COHERENCE_CHECKS",
    "HOP_CLIENT_SSE",
    "HOP_CLUSTER",
    "HOP_CONTEXT",
    "HOP_DAEMON_API",
    "HOP_DAEMON_SSE",
    "HOP_ENGINE",
    "HOP_GATE",
    "HOP_GATEWAY",
    "HOP_JOURNAL",
    "HOP_OBSERVE",
    "HOP_PIPE",
    "HOP_PROVIDER",
    "HOP_REPLAY",
    "HOP_SIDECARS",
    "HOP_TOOLS",
    "MAX_QUEUED_RANGE",
    "MAX_SIZE_BYTES",
    "REQUEST_PATH",
    "SCRIPTED_SEED_RANGE",
    "SECRET_SETTINGS_ENV",
    "SETTINGS",
    "SETTINGS_BY_KEY",
    "Budget",
    "BudgetError",
    "Ceiling",
    "CoherenceFinding",
    "GiB",
    "HoplineError",
    "IncoherentBudget",
    "KiB",
    "LimitExceeded",
    "MiB",
    "Setting",
    "Settings",
    "Unit",
    "check_coherence",
    "check_engine_within_gateway",
    "check_iteration_fits_engine",
    "check_pipe_ends_agree",
    "check_sidecar_quotas_nested",
    "check_sidecar_stub_within_sse_event",
    "check_sidecar_under_large_frame",
    "check_sse_event_within_client_reader",
    "check_sse_queue_holds_largest_events",
    "check_stream_carries_response",
    "check_summarization_fits_engine",
    "format_size",
    "limits_json",
    "parse_size",
    "redact_url",
    "require_coherent",
    "worst_case_iteration_bytes",
]
