"""The values in force for every ceiling of the table (:class:`Budget`), read from the environment.

The fields are declared by hand, typed, so that mypy checks every ``budget.<key>`` a module reads
(a class generated from the rows would type each field ``Any``); ``tests/test_budget.py`` holds the
declaration to the table: the same keys both ways, each field typed as its row's unit.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from hopline.budget.ceiling import Ceiling
from hopline.budget.table import CEILINGS, CEILINGS_BY_KEY, REQUEST_PATH


@dataclasses.dataclass(frozen=True)
class Budget:
    """The values in force for every ceiling of :data:`CEILINGS`, and where each came from."""

    api_json_body_limit: int
    transport_max_body_bytes: int
    provider_connect_timeout_seconds: float
    provider_read_timeout_seconds: float
    provider_response_max_bytes: int
    provider_stream_max_bytes: int
    model_retry_attempts: int
    model_retry_backoff_seconds: float
    context_window_tokens: int
    model_context_window_tokens: int
    compaction_threshold: float
    bytes_per_token: int
    summary_chunk_bytes: int
    summary_request_overhead_bytes: int
    summary_max_bytes: int
    summary_frame_bytes: int
    tool_result_max_bytes: int
    tool_arguments_max_bytes: int
    tool_calls_per_iteration_max: int
    plan_max_entries: int
    gate_max_iterations: int
    dev_max_iterations: int
    command_timeout_seconds: float
    command_output_max_bytes: int
    sandbox_cpu_seconds: float
    sandbox_memory_bytes: int
    sandbox_max_processes: int
    sandbox_file_max_bytes: int
    sandbox_tmpfs_bytes: int
    gate_test_timeout_seconds: float
    search_max_matches: int
    search_max_file_bytes: int
    pipe_max_frame_bytes: int
    agent_max_frame_bytes: int
    child_stderr_line_max_bytes: int
    child_stop_grace_seconds: float
    pipe_write_timeout_seconds: float
    agent_silence_seconds: float
    cancel_grace_seconds: float
    max_pending_permissions: int
    max_pending_permission_bytes: int
    large_frame_threshold_bytes: int
    large_frame_log_quota: int
    large_frame_log_window_seconds: float
    large_frame_recent_records: int
    daemon_json_body_limit: int
    sse_max_event_bytes: int
    client_sse_max_event_bytes: int
    client_sse_reconnect_attempts: int
    client_sse_reconnect_backoff_seconds: float
    client_http_timeout_seconds: float
    client_write_retry_attempts: int
    client_write_retry_backoff_seconds: float
    agent_handshake_timeout_seconds: float
    sse_queue_max_events: int
    sse_queue_max_bytes: int
    sse_heartbeat_seconds: float
    sse_catch_up_seconds: float
    ring_max_events: int
    ring_max_bytes: int
    journal_queue_max_events: int
    journal_queue_max_bytes: int
    journal_queue_share_max_events: int
    transcript_page_max_bytes: int
    transcript_page_envelope_bytes: int
    sse_event_envelope_bytes: int
    stub_title_max_chars: int
    error_data_echo_max_bytes: int
    error_message_echo_max_bytes: int
    serve_stop_grace_seconds: float
    path_id_max_chars: int
    bulk_replay_max_updates: int
    bulk_replay_max_bytes: int
    bulk_page_envelope_bytes: int
    json_max_depth: int
    body_read_timeout_seconds: float
    keep_alive_timeout_seconds: float
    request_head_timeout_seconds: float
    request_head_max_bytes: int
    request_head_max_headers: int
    max_connections: int
    session_idle_seconds: float
    max_pending_prompts: int
    prompt_block_max_bytes: int
    prompt_max_blocks: int
    max_live_sessions: int
    max_subscribers_per_session: int
    idempotency_ttl_seconds: float
    idempotency_max_keys: int
    idempotency_key_max_chars: int
    scripted_max_tools_per_iteration: int
    scripted_max_iterations: int
    scripted_max_write_bytes: int
    gate_concurrency: int
    gate_stall_seconds: float
    max_gate_runs: int
    gate_max_rounds: int
    gate_runs_kept: int
    gate_max_findings: int
    gate_message_max_chars: int
    gate_finding_file_max_chars: int
    gate_finding_rule_max_chars: int
    gate_git_output_max_bytes: int
    sidecar_threshold_bytes: int
    sidecar_preview_bytes: int
    sidecar_max_object_bytes: int
    sidecar_max_session_bytes: int
    sidecar_max_store_bytes: int
    sidecar_ttl_seconds: float
    sidecar_reap_interval_seconds: float
    range_header_max_chars: int
    sidecar_orphan_grace_seconds: float
    object_store_timeout_seconds: float
    owner_lease_seconds: float
    owner_lease_margin: float
    store_request_deadline_seconds: float
    cluster_forward_timeout_seconds: float
    store_max_connections: int
    store_lock_timeout_seconds: float
    store_statement_timeout_seconds: float
    store_idle_transaction_seconds: float
    store_outage_retry_seconds: float
    warm_children: int
    # key -> "default" or the env var that set it
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def defaults(cls) -> Budget:
        return cls(**{c.key: c.default for c in CEILINGS}, sources={})  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Budget:
        """Read every overridable ceiling from ``environ`` (default: the process environment).

        Raises :class:`BudgetError` naming the variable and the value on the first bad setting.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for ceiling in CEILINGS:
            raw = env.get(ceiling.env) if ceiling.env else None
            if raw is None or raw.strip() == "":
                values[ceiling.key] = ceiling.default
            else:
                values[ceiling.key] = ceiling.parse(raw)
                sources[ceiling.key] = ceiling.env  # type: ignore[assignment]
        return cls(**values, sources=sources)

    def replace(self, **changes: Any) -> Budget:
        """A copy with ``changes`` (validated); the source of a changed value is ``override``."""
        for key, value in changes.items():
            CEILINGS_BY_KEY[key].validate(value, value)
        sources = dict(self.sources)
        sources.update({key: "override" for key in changes})
        return dataclasses.replace(self, **changes, sources=sources)

    def source(self, key: str) -> str:
        return self.sources.get(key, "default")

    def value(self, key: str) -> int | float:
        value: int | float = getattr(self, key)
        return value

    def narrowest_request_ceiling(self) -> Ceiling:
        return min((CEILINGS_BY_KEY[k] for k in REQUEST_PATH), key=lambda c: self.value(c.key))

    def to_env(self) -> dict[str, str]:
        """Env vars that reproduce every overridden value (handed to child processes)."""
        return {
            c.env: str(self.value(c.key))
            for c in CEILINGS
            if c.env is not None and c.key in self.sources
        }
