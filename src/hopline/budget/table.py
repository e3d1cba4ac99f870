"""The one table of every hop's ceilings (SPEC B).

Every byte, count, token and time ceiling in hopline is declared here once, with its default, the
environment variable that overrides it, its unit and the hop it guards. No other module hard-codes
a ceiling: they all read a :class:`~hopline.budget.values.Budget`. A limit that exists only as a
library default is a failure waiting for the right payload (ADR 0098), so none is left implicit.
"""

from __future__ import annotations

from collections.abc import Mapping

from hopline.budget.ceiling import Ceiling, GiB, KiB, MiB, Unit
from hopline.errors import (
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
)

CEILINGS: tuple[Ceiling, ...] = (
    # --- hop 4 / hop 3: the llm-turn request path -------------------------------------------
    Ceiling("api_json_body_limit", HOP_GATEWAY, Unit.BYTES, 10 * MiB, "API_JSON_BODY_LIMIT",
            "gateway JSON body limit, enforced while reading"),
    Ceiling("transport_max_body_bytes", HOP_ENGINE, Unit.BYTES, 8 * MiB,
            "HOPLINE_TRANSPORT_MAX_BODY_BYTES", "engine transport ceiling for one llm-turn body"),
    Ceiling("provider_connect_timeout_seconds", HOP_PROVIDER, Unit.SECONDS, 10.0,
            "HOPLINE_PROVIDER_CONNECT_TIMEOUT", "provider connect timeout", minimum=0.001),
    Ceiling("provider_read_timeout_seconds", HOP_PROVIDER, Unit.SECONDS, 120.0,
            "HOPLINE_PROVIDER_READ_TIMEOUT", "provider read timeout", minimum=0.001),
    Ceiling("provider_response_max_bytes", HOP_PROVIDER, Unit.BYTES, 10 * MiB,
            "HOPLINE_PROVIDER_RESPONSE_MAX_BYTES", "one provider answer, read by the gateway"),
    Ceiling("provider_stream_max_bytes", HOP_PROVIDER, Unit.BYTES, 64 * MiB,
            "HOPLINE_PROVIDER_STREAM_MAX_BYTES",
            "raw bytes of one streamed answer, framing included (provider SSE, gateway NDJSON)"),
    Ceiling("model_retry_attempts", HOP_ENGINE, Unit.COUNT, 3, "HOPLINE_MODEL_RETRY_ATTEMPTS",
            "retries of a transient model-origin failure", minimum=0, maximum=10),
    Ceiling("model_retry_backoff_seconds", HOP_ENGINE, Unit.SECONDS, 0.2,
            "HOPLINE_MODEL_RETRY_BACKOFF", "first backoff of a model retry (doubles)", minimum=0),
    # --- the context manager ------------------------------------------------------------------
    Ceiling("context_window_tokens", HOP_CONTEXT, Unit.TOKENS, 128_000, None,
            "model context window (declared per agent profile)"),
    Ceiling("model_context_window_tokens", HOP_CONTEXT, Unit.TOKENS, 128_000, "HOPLINE_MODEL_CONTEXT_WINDOW",
            "the real model's context window: when set, it overrides the profile's"),
    Ceiling("compaction_threshold", HOP_CONTEXT, Unit.RATIO, 0.7, None,
            "compact when estimate > threshold x effective window (per profile)",
            minimum=0.05, maximum=0.95),
    Ceiling("bytes_per_token", HOP_CONTEXT, Unit.COUNT, 4, "HOPLINE_BYTES_PER_TOKEN",
            "approximate tokenizer: bytes per token", maximum=64),
    Ceiling("summary_chunk_bytes", HOP_CONTEXT, Unit.BYTES, 2 * MiB, "HOPLINE_SUMMARY_CHUNK_BYTES",
            "old history sent in one summarization request"),
    Ceiling("summary_request_overhead_bytes", HOP_CONTEXT, Unit.BYTES, 64 * KiB, None,
            "room reserved in a summarization request for its prompt and JSON framing"),
    Ceiling("summary_max_bytes", HOP_CONTEXT, Unit.BYTES, 16 * KiB, "HOPLINE_SUMMARY_MAX_BYTES",
            "one summary message"),
    Ceiling("summary_frame_bytes", HOP_CONTEXT, Unit.BYTES, 512, None,
            "room reserved for a summary message's framing (marker, counts, JSON keys) beyond its text"),
    # --- the tool loop ------------------------------------------------------------------------
    Ceiling("tool_result_max_bytes", HOP_TOOLS, Unit.BYTES, 32 * KiB,
            "HOPLINE_TOOL_RESULT_MAX_BYTES", "one tool result, as given to the model"),
    Ceiling("tool_arguments_max_bytes", HOP_TOOLS, Unit.BYTES, 256 * KiB,
            "HOPLINE_TOOL_ARGUMENTS_MAX_BYTES", "one tool call's JSON arguments"),
    Ceiling("tool_calls_per_iteration_max", HOP_TOOLS, Unit.COUNT, 8,
            "HOPLINE_TOOL_CALLS_PER_ITERATION", "tool calls executed from one model answer"),
    Ceiling("plan_max_entries", HOP_TOOLS, Unit.COUNT, 16, "HOPLINE_PLAN_MAX_ENTRIES",
            "entries of the ACP plan update (older finished iterations fold into one)",
            minimum=2, maximum=256),
    Ceiling("gate_max_iterations", HOP_TOOLS, Unit.COUNT, 60, None,
            "tool-loop iterations of a gate agent (per profile)"),
    Ceiling("dev_max_iterations", HOP_TOOLS, Unit.COUNT, 40, None,
            "tool-loop iterations of the dev agent (per profile)"),
    Ceiling("command_timeout_seconds", HOP_TOOLS, Unit.SECONDS, 30.0,
            "HOPLINE_COMMAND_TIMEOUT", "run_command wall-clock timeout", minimum=0.01),
    Ceiling("command_output_max_bytes", HOP_TOOLS, Unit.BYTES, 4 * MiB,
            "HOPLINE_COMMAND_OUTPUT_MAX_BYTES", "run_command output captured before the cap"),
    # --- the sandbox of a command run on a pull request's code (SPEC T-7) ------------------
    Ceiling("sandbox_cpu_seconds", HOP_TOOLS, Unit.SECONDS, 300.0, "HOPLINE_SANDBOX_CPU_SECONDS",
            "CPU time of one sandboxed command (RLIMIT_CPU, whole seconds, rounded up)", minimum=1),
    Ceiling("sandbox_memory_bytes", HOP_TOOLS, Unit.BYTES, 4 * GiB, "HOPLINE_SANDBOX_MEMORY_BYTES",
            "address space of each process of a sandboxed command (RLIMIT_AS)", minimum=64 * MiB),
    Ceiling("sandbox_max_processes", HOP_TOOLS, Unit.COUNT, 512, "HOPLINE_SANDBOX_MAX_PROCESSES",
            "processes of a sandboxed command: as root, the pids.max of a pids cgroup of its own "
            "(RLIMIT_NPROC does not bind root); otherwise RLIMIT_NPROC", minimum=8),
    Ceiling("sandbox_file_max_bytes", HOP_TOOLS, Unit.BYTES, 256 * MiB, "HOPLINE_SANDBOX_FILE_MAX_BYTES",
            "one file a sandboxed command writes (RLIMIT_FSIZE)", minimum=64 * KiB),
    Ceiling("sandbox_tmpfs_bytes", HOP_TOOLS, Unit.BYTES, 1 * GiB, "HOPLINE_SANDBOX_TMPFS_BYTES",
            "the private writable tmpfs of a sandboxed command (caches, build output)", minimum=1 * MiB),
    Ceiling("gate_test_timeout_seconds", HOP_TOOLS, Unit.SECONDS, 240.0, "HOPLINE_GATE_TEST_TIMEOUT",
            "wall-clock time of the test command a gate runs (under HOPLINE_GATE_STALL_SECONDS)",
            minimum=0.1),
    Ceiling("search_max_matches", HOP_TOOLS, Unit.COUNT, 200, "HOPLINE_SEARCH_MAX_MATCHES",
            "search_workspace matches"),
    Ceiling("search_max_file_bytes", HOP_TOOLS, Unit.BYTES, 2 * MiB,
            "HOPLINE_SEARCH_MAX_FILE_BYTES", "search_workspace skips larger files"),
    # --- hop 2: the ACP pipe ------------------------------------------------------------------
    # 32 MiB: the official TypeScript SDK's ndJsonStream refuses a larger message, so a frame
    # between that and a larger default would be refused by a stock client of `hopline agent`.
    Ceiling("pipe_max_frame_bytes", HOP_PIPE, Unit.BYTES, 32 * MiB, "HOPLINE_PIPE_MAX_FRAME_BYTES",
            "ACP pipe max frame, daemon reader side (both directions)"),
    Ceiling("agent_max_frame_bytes", HOP_PIPE, Unit.BYTES, 32 * MiB, "HOPLINE_AGENT_MAX_FRAME_BYTES",
            "ACP pipe max frame, agent SDK reader side (must equal the daemon's)"),
    Ceiling("child_stderr_line_max_bytes", HOP_PIPE, Unit.BYTES, 8 * KiB,
            "HOPLINE_CHILD_STDERR_LINE_MAX_BYTES", "one drained stderr line of a child"),
    Ceiling("child_stop_grace_seconds", HOP_PIPE, Unit.SECONDS, 2.0, "HOPLINE_CHILD_STOP_GRACE_SECONDS",
            "a stopped child's time to exit after its stdin closes, then again after SIGTERM (then SIGKILL)",
            minimum=0.01),
    Ceiling("pipe_write_timeout_seconds", HOP_PIPE, Unit.SECONDS, 30.0, "HOPLINE_PIPE_WRITE_TIMEOUT",
            "one write to a child's stdin (then the child is not reading: its session's prompts end "
            "with turn_error agent_not_reading and the child is stopped)", minimum=0.01),
    Ceiling("agent_silence_seconds", HOP_PIPE, Unit.SECONDS, 600.0, "HOPLINE_AGENT_SILENCE_SECONDS",
            "a child that writes nothing this long while a request to it is pending (time spent waiting "
            "for a client's permission answer does not count) is stopped: its turn ends with turn_error "
            "agent_unresponsive", minimum=0.01),
    Ceiling("cancel_grace_seconds", HOP_PIPE, Unit.SECONDS, 5.0, "HOPLINE_CANCEL_GRACE_SECONDS",
            "after POST /cancel, the agent's time to end its turn; then the daemon ends it (turn_complete, "
            "stopReason cancelled, origin daemon), stops the agent, and the next prompt starts a new one",
            minimum=0.01),
    Ceiling("max_pending_permissions", HOP_PIPE, Unit.COUNT, 32, "HOPLINE_MAX_PENDING_PERMISSIONS",
            "agent-initiated requests (permission requests) pending in one session "
            "(more: a JSON-RPC error to the child, counted)"),
    Ceiling("max_pending_permission_bytes", HOP_PIPE, Unit.BYTES, 4 * MiB,
            "HOPLINE_MAX_PENDING_PERMISSION_BYTES",
            "bytes the pending agent-initiated requests of one session hold, after projection "
            "(more: a JSON-RPC error to the child, counted)"),
    Ceiling("large_frame_threshold_bytes", HOP_OBSERVE, Unit.BYTES, 256 * KiB, None,
            "large-frame attribution threshold (inclusive)"),
    Ceiling("large_frame_log_quota", HOP_OBSERVE, Unit.COUNT, 50, None,
            "large-frame records per sampling window"),
    Ceiling("large_frame_log_window_seconds", HOP_OBSERVE, Unit.SECONDS, 60.0, None,
            "large-frame sampling window"),
    Ceiling("large_frame_recent_records", HOP_OBSERVE, Unit.COUNT, 50, "HOPLINE_LARGE_FRAME_RECENT_RECORDS",
            "latest large-frame records kept in memory for GET /daemon/frames (the console)",
            minimum=0, maximum=1000),
    # --- hop 1: daemon API and SSE ------------------------------------------------------------
    Ceiling("daemon_json_body_limit", HOP_DAEMON_API, Unit.BYTES, 1 * MiB,
            "HOPLINE_DAEMON_JSON_BODY_LIMIT", "daemon API JSON body limit (prompts, permissions)"),
    Ceiling("sse_max_event_bytes", HOP_DAEMON_SSE, Unit.BYTES, 16 * MiB,
            "HOPLINE_SSE_MAX_EVENT_BYTES", "largest SSE event the daemon emits"),
    Ceiling("client_sse_max_event_bytes", HOP_CLIENT_SSE, Unit.BYTES, 16 * MiB,
            "HOPLINE_CLIENT_SSE_MAX_EVENT_BYTES", "SSE event, client reader"),
    Ceiling("client_sse_reconnect_attempts", HOP_CLIENT_SSE, Unit.COUNT, 8,
            "HOPLINE_CLIENT_SSE_RECONNECT_ATTEMPTS", "failed SSE reconnects in a row before giving up",
            minimum=0),
    Ceiling("client_sse_reconnect_backoff_seconds", HOP_CLIENT_SSE, Unit.SECONDS, 0.1,
            "HOPLINE_CLIENT_SSE_RECONNECT_BACKOFF", "first SSE reconnect backoff (doubles, capped at x32)",
            minimum=0),
    Ceiling("client_http_timeout_seconds", HOP_DAEMON_API, Unit.SECONDS, 30.0,
            "HOPLINE_CLIENT_HTTP_TIMEOUT", "one non-streaming daemon API call, client side", minimum=0.01),
    Ceiling("client_write_retry_attempts", HOP_DAEMON_API, Unit.COUNT, 4,
            "HOPLINE_CLIENT_WRITE_RETRY_ATTEMPTS",
            "retries of a write whose answer was lost or that was refused before it ran (the SDK, the CLI; "
            "with the write's Idempotency-Key, so none runs twice)", minimum=0, maximum=100),
    Ceiling("client_write_retry_backoff_seconds", HOP_DAEMON_API, Unit.SECONDS, 0.25,
            "HOPLINE_CLIENT_WRITE_RETRY_BACKOFF",
            "first wait before such a retry (doubles; a longer Retry-After is waited instead, up to the "
            "client HTTP timeout)", minimum=0),
    Ceiling("agent_handshake_timeout_seconds", HOP_PIPE, Unit.SECONDS, 60.0,
            "HOPLINE_AGENT_HANDSHAKE_TIMEOUT", "a child's answer to initialize, session/new, load",
            minimum=0.01),
    Ceiling("warm_children", HOP_PIPE, Unit.COUNT, 1, "HOPLINE_WARM_CHILDREN",
            "started and initialized agent children kept ready per agent command (0: off)",
            minimum=0, maximum=16),
    Ceiling("sse_queue_max_events", HOP_DAEMON_SSE, Unit.COUNT, 256, "HOPLINE_SSE_QUEUE_MAX_EVENTS",
            "per-subscriber queue (clients may choose maxQueued in [16, 2048])",
            minimum=16, maximum=2048),
    Ceiling("sse_queue_max_bytes", HOP_DAEMON_SSE, Unit.BYTES, 2 * MiB,
            "HOPLINE_SSE_QUEUE_MAX_BYTES", "per-subscriber queue bytes (not client-settable)"),
    Ceiling("sse_heartbeat_seconds", HOP_DAEMON_SSE, Unit.SECONDS, 15.0,
            "HOPLINE_SSE_HEARTBEAT_SECONDS", "SSE heartbeat comment interval", minimum=0.01),
    Ceiling("sse_catch_up_seconds", HOP_DAEMON_SSE, Unit.SECONDS, 0.1, "HOPLINE_SSE_CATCH_UP_SECONDS",
            "how long a session's pipe reader waits, before its next read, for a subscriber past half its "
            "queue to catch up (one that does not is then evicted as its queue fills)", minimum=0),
    Ceiling("ring_max_events", HOP_DAEMON_SSE, Unit.COUNT, 8000, "HOPLINE_RING_MAX_EVENTS",
            "replay ring per session, events"),
    Ceiling("ring_max_bytes", HOP_DAEMON_SSE, Unit.BYTES, 8 * MiB, "HOPLINE_RING_MAX_BYTES",
            "replay ring per session, bytes"),
    Ceiling("journal_queue_max_events", HOP_JOURNAL, Unit.COUNT, 4096, "HOPLINE_JOURNAL_QUEUE_MAX_EVENTS",
            "events handed to the journal's writer and not yet committed; past it the pipe readers stop "
            "reading their children until the writer catches up"),
    Ceiling("journal_queue_max_bytes", HOP_JOURNAL, Unit.BYTES, 16 * MiB, "HOPLINE_JOURNAL_QUEUE_MAX_BYTES",
            "data bytes of those events; past it the pipe readers stop reading their children"),
    Ceiling("journal_queue_share_max_events", HOP_JOURNAL, Unit.COUNT, 512,
            "HOPLINE_JOURNAL_QUEUE_SHARE_MAX_EVENTS",
            "while other sessions compete, one session's events in that queue (or the queue's bound "
            "divided by the sessions, when lower); past it that session's pipe reader waits: another "
            "session's events queue behind at most this many of a flood's", minimum=1),
    Ceiling("transcript_page_max_bytes", HOP_DAEMON_API, Unit.BYTES, 1 * MiB,
            "HOPLINE_TRANSCRIPT_PAGE_MAX_BYTES", "one transcript page"),
    Ceiling("transcript_page_envelope_bytes", HOP_DAEMON_API, Unit.BYTES, 64, None,
            "room reserved in a transcript page for its JSON envelope (events list, nextCursor)"),
    Ceiling("sse_event_envelope_bytes", HOP_DAEMON_SSE, Unit.BYTES, 1 * KiB, None,
            "room reserved in an SSE event for the envelope around an update (id and event lines, promptId)"),
    Ceiling("stub_title_max_chars", HOP_DAEMON_SSE, Unit.COUNT, 128, None,
            "characters of a tool title kept in the stub of an update over the SSE event limit"),
    Ceiling("error_data_echo_max_bytes", HOP_DAEMON_API, Unit.BYTES, 4 * KiB,
            "HOPLINE_ERROR_DATA_ECHO_MAX_BYTES",
            "an agent's JSON-RPC error data echoed to a client (larger: only its size is)"),
    Ceiling("error_message_echo_max_bytes", HOP_DAEMON_API, Unit.BYTES, 1 * KiB,
            "HOPLINE_ERROR_MESSAGE_ECHO_MAX_BYTES",
            "an agent's JSON-RPC error message echoed to a client (longer: cut, its size said)"),
    Ceiling("serve_stop_grace_seconds", HOP_DAEMON_API, Unit.SECONDS, 5.0, None,
            "a stopping daemon's time to finish its open requests (whole seconds, rounded up)"),
    Ceiling("path_id_max_chars", HOP_DAEMON_API, Unit.COUNT, 128, None,
            "a session or request id in a path (longer: 404 before any lookup)"),
    Ceiling("bulk_replay_max_updates", HOP_REPLAY, Unit.COUNT, 10_000,
            "HOPLINE_BULK_REPLAY_MAX_UPDATES", "bulk replay (session load), updates"),
    Ceiling("bulk_replay_max_bytes", HOP_REPLAY, Unit.BYTES, 32 * MiB,
            "HOPLINE_BULK_REPLAY_MAX_BYTES", "bulk replay (session load), bytes"),
    Ceiling("bulk_page_envelope_bytes", HOP_REPLAY, Unit.BYTES, 256, None,
            "room reserved in an agent's bulk replay page for the JSON-RPC response around it"),
    # --- hostile input and load (D-10): client input never makes work past these ------------
    Ceiling("json_max_depth", HOP_DAEMON_API, Unit.COUNT, 64, "HOPLINE_JSON_MAX_DEPTH",
            "JSON nesting of a request body (daemon API and gateway alike)", minimum=2, maximum=128),
    Ceiling("body_read_timeout_seconds", HOP_DAEMON_API, Unit.SECONDS, 30.0, "HOPLINE_BODY_READ_TIMEOUT",
            "reading one request body, from the request's start (daemon and gateway; then 408)",
            minimum=0.01),
    Ceiling("keep_alive_timeout_seconds", HOP_DAEMON_API, Unit.SECONDS, 5.0, "HOPLINE_KEEP_ALIVE_TIMEOUT",
            "idle HTTP keep-alive connection (daemon and gateway; whole seconds, rounded up)", minimum=1),
    Ceiling("request_head_timeout_seconds", HOP_DAEMON_API, Unit.SECONDS, 10.0,
            "HOPLINE_REQUEST_HEAD_TIMEOUT",
            "one request's line and headers, from the connection's start or the previous response "
            "(daemon and gateway; then 408 and closed)", minimum=0.01),
    Ceiling("request_head_max_bytes", HOP_DAEMON_API, Unit.BYTES, 64 * KiB, "HOPLINE_REQUEST_HEAD_MAX_BYTES",
            "one request's line and headers, before authentication (daemon and gateway; more: 431 and "
            "closed)", minimum=1 * KiB),
    Ceiling("request_head_max_headers", HOP_DAEMON_API, Unit.COUNT, 100, "HOPLINE_REQUEST_HEAD_MAX_HEADERS",
            "header fields of one request, before authentication (daemon and gateway; more: 431 and "
            "closed)", minimum=8),
    Ceiling("max_connections", HOP_DAEMON_API, Unit.COUNT, 1024, "HOPLINE_MAX_CONNECTIONS",
            "HTTP connections open at once, SSE streams among them "
            "(daemon and gateway; more: 503 and closed)"),
    Ceiling("session_idle_seconds", HOP_DAEMON_API, Unit.SECONDS, 3600.0, "HOPLINE_SESSION_IDLE_SECONDS",
            "a session with no prompt, no subscriber, no pending permission and no client request for this "
            "long has its agent stopped (its journal stays; a load restores it); 0: never",
            minimum=0.0),
    Ceiling("max_pending_prompts", HOP_DAEMON_API, Unit.COUNT, 16, "HOPLINE_MAX_PENDING_PROMPTS",
            "prompts running or queued in one session (then 429)"),
    Ceiling("prompt_block_max_bytes", HOP_DAEMON_API, Unit.BYTES, 1 * MiB, "HOPLINE_PROMPT_BLOCK_MAX_BYTES",
            "one content block of a prompt, its compact JSON (an image's or audio's base64 data "
            "included; then 413)"),
    Ceiling("prompt_max_blocks", HOP_DAEMON_API, Unit.COUNT, 256, "HOPLINE_PROMPT_MAX_BLOCKS",
            "content blocks of one prompt (then 422)"),
    Ceiling("max_live_sessions", HOP_DAEMON_API, Unit.COUNT, 64, "HOPLINE_MAX_LIVE_SESSIONS",
            "sessions with an agent child in one daemon (then 503)"),
    Ceiling("max_subscribers_per_session", HOP_DAEMON_SSE, Unit.COUNT, 32,
            "HOPLINE_MAX_SUBSCRIBERS_PER_SESSION", "concurrent SSE streams of one session (then 429)"),
    # --- idempotent writes (SPEC T-12): POST /session, prompt, cancel, permission ---------------
    Ceiling("idempotency_ttl_seconds", HOP_DAEMON_API, Unit.SECONDS, 24 * 3600.0,
            "HOPLINE_IDEMPOTENCY_TTL_SECONDS",
            "how long a write's Idempotency-Key is kept: a retry with the same key and body within it gets "
            "the first answer and runs nothing; then the key is purged", minimum=1),
    Ceiling("idempotency_max_keys", HOP_DAEMON_API, Unit.COUNT, 1_000_000, "HOPLINE_IDEMPOTENCY_MAX_KEYS",
            "Idempotency-Keys kept in the store (every daemon's together; expired ones are purged first; "
            "then a keyed write answers 503)", minimum=1),
    Ceiling("idempotency_key_max_chars", HOP_DAEMON_API, Unit.COUNT, 255, None,
            "characters of an Idempotency-Key header (printable ASCII; longer: 400)"),
    Ceiling("scripted_max_tools_per_iteration", HOP_GATEWAY, Unit.COUNT, 64,
            "HOPLINE_SCRIPTED_MAX_TOOLS_PER_ITERATION", "scripted model hint toolsPerIteration"),
    Ceiling("scripted_max_iterations", HOP_GATEWAY, Unit.COUNT, 1000, "HOPLINE_SCRIPTED_MAX_ITERATIONS",
            "scripted model hint iterations"),
    Ceiling("scripted_max_write_bytes", HOP_GATEWAY, Unit.BYTES, 256 * KiB,
            "HOPLINE_SCRIPTED_MAX_WRITE_BYTES",
            "scripted model hint writeBytes (one write_file's content)"),
    # --- the gate workflow (ADR 0098, RN-412) -------------------------------------------------
    Ceiling("gate_concurrency", HOP_GATE, Unit.COUNT, 2, "HOPLINE_GATE_CONCURRENCY",
            "gate agent sessions running at once in one daemon (the others wait, gate_queued)",
            maximum=16),
    Ceiling("gate_stall_seconds", HOP_GATE, Unit.SECONDS, 300.0, "HOPLINE_GATE_STALL_SECONDS",
            "a gate with no event for this long is gate_stalled (retried once, then error)",
            minimum=0.05),
    Ceiling("max_gate_runs", HOP_GATE, Unit.COUNT, 4, "HOPLINE_MAX_GATE_RUNS",
            "gate runs in progress in one daemon (then 429)", maximum=64),
    Ceiling("gate_max_rounds", HOP_GATE, Unit.COUNT, 5, "HOPLINE_GATE_MAX_ROUNDS",
            "gate rounds of one run (--rounds: gate, dev fix, gate again...)", maximum=20),
    Ceiling("gate_runs_kept", HOP_GATE, Unit.COUNT, 32, "HOPLINE_GATE_RUNS_KEPT",
            "ended gate runs kept in memory (older ones are read back from the journal)", maximum=1000),
    Ceiling("gate_max_findings", HOP_GATE, Unit.COUNT, 200, "HOPLINE_GATE_MAX_FINDINGS",
            "findings kept per verdict (more are counted as omitted, never dropped silently)",
            maximum=10_000),
    Ceiling("gate_message_max_chars", HOP_GATE, Unit.COUNT, 2000, "HOPLINE_GATE_MESSAGE_MAX_CHARS",
            "characters of a finding's message or a verdict's summary (longer: cut, saying how long it was)",
            minimum=64, maximum=100_000),
    Ceiling("gate_finding_file_max_chars", HOP_GATE, Unit.COUNT, 1024, None,
            "characters of a finding's file (longer: the verdict is invalid, asked for once more)"),
    Ceiling("gate_finding_rule_max_chars", HOP_GATE, Unit.COUNT, 128, None,
            "characters of a finding's rule id (longer: the verdict is invalid, asked for once more)"),
    Ceiling("gate_git_output_max_bytes", HOP_GATE, Unit.BYTES, 64 * KiB, None,
            "what one of the gate's own git commands prints (a commit id, a ref; more is an error)"),
    # --- sidecars -----------------------------------------------------------------------------
    Ceiling("sidecar_threshold_bytes", HOP_SIDECARS, Unit.BYTES, 64 * KiB,
            "HOPLINE_SIDECAR_THRESHOLD_BYTES", "a tool output field larger than this goes to a sidecar"),
    Ceiling("sidecar_preview_bytes", HOP_SIDECARS, Unit.BYTES, 2 * KiB,
            "HOPLINE_SIDECAR_PREVIEW_BYTES",
            "preview kept on the wire (head and tail); no field this size or smaller moves to a sidecar"),
    Ceiling("sidecar_max_object_bytes", HOP_SIDECARS, Unit.BYTES, 64 * MiB,
            "HOPLINE_SIDECAR_MAX_OBJECT_BYTES", "one sidecar object"),
    Ceiling("sidecar_max_session_bytes", HOP_SIDECARS, Unit.BYTES, 256 * MiB,
            "HOPLINE_SIDECAR_MAX_SESSION_BYTES", "sidecars of one session"),
    Ceiling("sidecar_max_store_bytes", HOP_SIDECARS, Unit.BYTES, 2 * GiB,
            "HOPLINE_SIDECAR_MAX_STORE_BYTES", "the whole sidecar store"),
    Ceiling("sidecar_ttl_seconds", HOP_SIDECARS, Unit.SECONDS, 24 * 3600.0,
            "HOPLINE_SIDECAR_TTL_SECONDS", "sidecar time to live", minimum=1),
    Ceiling("sidecar_reap_interval_seconds", HOP_SIDECARS, Unit.SECONDS, 3600.0,
            "HOPLINE_SIDECAR_REAP_INTERVAL_SECONDS", "how often the daemon reaps expired sidecars",
            minimum=0.01),
    Ceiling("range_header_max_chars", HOP_SIDECARS, Unit.COUNT, 200, None,
            "a sidecar download's Range header (longer: ignored, the whole object is sent)"),
    Ceiling("sidecar_orphan_grace_seconds", HOP_SIDECARS, Unit.SECONDS, 3600.0,
            "HOPLINE_SIDECAR_ORPHAN_GRACE_SECONDS",
            "a shared store's sidecar body with no index row is collected once older than this "
            "(younger: another daemon may be writing it)", minimum=1),
    Ceiling("object_store_timeout_seconds", HOP_SIDECARS, Unit.SECONDS, 10.0, "HOPLINE_OBJECT_STORE_TIMEOUT",
            "one object-store request (S3: a head, a delete, a list page, a 1 MiB piece of a download, a "
            "5 MiB part of an upload), its retries included; then the update goes out degraded "
            "(object_store_unavailable) and a download answers 503 with Retry-After", minimum=0.05,
            maximum=600),
    # --- several daemons on one store (SPEC X) --------------------------------------------------
    Ceiling("owner_lease_seconds", HOP_CLUSTER, Unit.SECONDS, 10.0, "HOPLINE_OWNER_LEASE_SECONDS",
            "a session owner's lease in the store, renewed every third of it; expired, the next write "
            "to any daemon adopts the session", minimum=1, maximum=3600),
    Ceiling("owner_lease_margin", HOP_CLUSTER, Unit.RATIO, 1 / 3, "HOPLINE_OWNER_LEASE_MARGIN",
            "the part of the lease a daemon keeps in hand: once its last successful renewal (from when it "
            "was sent, on its monotonic clock) is older than the lease minus this part of it, it freezes "
            "and stops its sessions' agents, before the store can give them to another daemon; a renewal "
            "is also given up (its connection closed) after this part of the lease", minimum=0.05,
            maximum=0.9),
    Ceiling("store_request_deadline_seconds", HOP_CLUSTER, Unit.SECONDS, 5.0,
            "HOPLINE_STORE_REQUEST_DEADLINE_SECONDS",
            "a request's wait on the store (any route, a lease or journal statement, a read): then 503 "
            "storage_unavailable with Retry-After; events already accepted keep their own retry window "
            "(HOPLINE_STORE_OUTAGE_RETRY_SECONDS)", minimum=0.1, maximum=600),
    Ceiling("cluster_forward_timeout_seconds", HOP_CLUSTER, Unit.SECONDS, 90.0,
            "HOPLINE_CLUSTER_FORWARD_TIMEOUT", "a write forwarded to its session's owner daemon (then 504)",
            minimum=0.01),
    Ceiling("store_max_connections", HOP_CLUSTER, Unit.COUNT, 4, "HOPLINE_STORE_MAX_CONNECTIONS",
            "PostgreSQL connections of one daemon's journal reads (beside its writer, its sidecar index "
            "and its LISTEN connection)", minimum=1, maximum=64),
    Ceiling("store_lock_timeout_seconds", HOP_CLUSTER, Unit.SECONDS, 1.0,
            "HOPLINE_STORE_LOCK_TIMEOUT_SECONDS",
            "a lease operation waiting on a row lock (PostgreSQL lock_timeout; then 503 and Retry-After: "
            "one frozen daemon never freezes another)", minimum=0.01, maximum=600),
    Ceiling("store_statement_timeout_seconds", HOP_CLUSTER, Unit.SECONDS, 5.0,
            "HOPLINE_STORE_STATEMENT_TIMEOUT_SECONDS",
            "one lease or heartbeat statement (PostgreSQL statement_timeout, and the daemon's own deadline "
            "on the answer; then 503 and Retry-After)", minimum=0.05, maximum=600),
    Ceiling("store_outage_retry_seconds", HOP_CLUSTER, Unit.SECONDS, 30.0,
            "HOPLINE_STORE_OUTAGE_RETRY_SECONDS",
            "a journal commit that failed on a lost connection is retried this long once reconnected "
            "(its events wait in the journal queue, which holds the child back); then it is lost, said",
            minimum=0, maximum=3600),
    Ceiling("store_idle_transaction_seconds", HOP_CLUSTER, Unit.SECONDS, 5.0,
            "HOPLINE_STORE_IDLE_TRANSACTION_SECONDS",
            "a journal transaction left idle by its daemon (frozen mid-commit): PostgreSQL ends it "
            "(idle_in_transaction_session_timeout), its locks go, another daemon can adopt",
            minimum=0.05, maximum=3600),
)

CEILINGS_BY_KEY: Mapping[str, Ceiling] = {c.key: c for c in CEILINGS}

# The byte ceilings one llm-turn request crosses, in order; the narrowest is marked by `limits`.
REQUEST_PATH: tuple[str, ...] = ("transport_max_body_bytes", "api_json_body_limit")

# The client knob of B-5: the only value a client may choose, and only inside this range.
MAX_QUEUED_RANGE: tuple[int, int] = (16, 2048)

# The scripted model's seed hint: any value SQLite and orjson hold exactly (a range, not a cost).
SCRIPTED_SEED_RANGE: tuple[int, int] = (0, 2**63 - 1)
