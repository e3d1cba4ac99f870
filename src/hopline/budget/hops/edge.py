"""The daemon's edge (hop 1): its HTTP API, its event streams, a client reading them, and an agent's
bulk replay."""

from __future__ import annotations

from hopline.budget.ceiling import KiB, MiB, Unit
from hopline.budget.declare import Bytes, Count, HopSettings, Seconds, fixed, limit
from hopline.errors import HOP_CLIENT_SSE, HOP_DAEMON_API, HOP_DAEMON_SSE, HOP_REPLAY


class DaemonApiLimits(HopSettings, hop=HOP_DAEMON_API):
    """Hop 1: the daemon's HTTP API, both apps' request heads and bodies, a client's calls."""

    daemon_json_body_limit: Bytes = limit(1 * MiB, "HOPLINE_DAEMON_JSON_BODY_LIMIT",
                                          "daemon API JSON body limit (prompts, permissions)")
    client_http_timeout_seconds: Seconds = limit(30.0, "HOPLINE_CLIENT_HTTP_TIMEOUT",
                                                 "one non-streaming daemon API call, client side", ge=0.01)
    client_write_retry_attempts: Count = limit(4, "HOPLINE_CLIENT_WRITE_RETRY_ATTEMPTS",
                                               "retries of a write whose answer was lost or that was refused "
                                               "before it ran (the SDK, the CLI; with the write's "
                                               "Idempotency-Key, so none runs twice)", ge=0, le=100)
    client_write_retry_backoff_seconds: Seconds = limit(0.25, "HOPLINE_CLIENT_WRITE_RETRY_BACKOFF",
                                                        "first wait before such a retry (doubles; a "
                                                        "longer Retry-After is waited instead, up to the "
                                                        "client HTTP timeout)", ge=0)
    transcript_page_max_bytes: Bytes = limit(1 * MiB, "HOPLINE_TRANSCRIPT_PAGE_MAX_BYTES",
                                             "one transcript page")
    error_data_echo_max_bytes: Bytes = limit(4 * KiB, "HOPLINE_ERROR_DATA_ECHO_MAX_BYTES",
                                             "an agent's JSON-RPC error data echoed to a client (larger: "
                                             "only its size is)")
    error_message_echo_max_bytes: Bytes = limit(1 * KiB, "HOPLINE_ERROR_MESSAGE_ECHO_MAX_BYTES",
                                                "an agent's JSON-RPC error message echoed to a client "
                                                "(longer: cut, its size said)")
    json_max_depth: Count = limit(64, "HOPLINE_JSON_MAX_DEPTH",
                                  "JSON nesting of a request body (daemon API and gateway alike)",
                                  ge=2, le=128)
    body_read_timeout_seconds: Seconds = limit(30.0, "HOPLINE_BODY_READ_TIMEOUT",
                                               "reading one request body, from the request's start (daemon "
                                               "and gateway; then 408)", ge=0.01)
    keep_alive_timeout_seconds: Seconds = limit(5.0, "HOPLINE_KEEP_ALIVE_TIMEOUT",
                                                "idle HTTP keep-alive connection (daemon and gateway; whole "
                                                "seconds, rounded up)")
    request_head_timeout_seconds: Seconds = limit(10.0, "HOPLINE_REQUEST_HEAD_TIMEOUT",
                                                  "one request's line and headers, from the connection's "
                                                  "start or the previous response (daemon and gateway; then "
                                                  "408 and closed)", ge=0.01)
    request_head_max_bytes: Bytes = limit(64 * KiB, "HOPLINE_REQUEST_HEAD_MAX_BYTES",
                                          "one request's line and headers, before authentication (daemon "
                                          "and gateway; more: 431 and closed)", ge=1 * KiB)
    request_head_max_headers: Count = limit(100, "HOPLINE_REQUEST_HEAD_MAX_HEADERS",
                                            "header fields of one request, before authentication (daemon "
                                            "and gateway; more: 431 and closed)", ge=8)
    max_connections: Count = limit(1024, "HOPLINE_MAX_CONNECTIONS",
                                   "HTTP connections open at once, SSE streams among them (daemon and "
                                   "gateway; more: 503 and closed)")
    session_idle_seconds: Seconds = limit(3600.0, "HOPLINE_SESSION_IDLE_SECONDS",
                                          "a session with no prompt, no subscriber, no pending permission "
                                          "and no client request for this long has its agent stopped (its "
                                          "journal stays; a load restores it); 0: never", ge=0)
    max_pending_prompts: Count = limit(16, "HOPLINE_MAX_PENDING_PROMPTS",
                                       "prompts running or queued in one session (then 429)")
    prompt_block_max_bytes: Bytes = limit(1 * MiB, "HOPLINE_PROMPT_BLOCK_MAX_BYTES",
                                          "one content block of a prompt, its compact JSON (an image's or "
                                          "audio's base64 data included; then 413)")
    prompt_max_blocks: Count = limit(256, "HOPLINE_PROMPT_MAX_BLOCKS",
                                     "content blocks of one prompt (then 422)")
    max_live_sessions: Count = limit(64, "HOPLINE_MAX_LIVE_SESSIONS",
                                     "sessions with an agent child in one daemon (then 503)")
    idempotency_ttl_seconds: Seconds = limit(24 * 3600.0, "HOPLINE_IDEMPOTENCY_TTL_SECONDS",
                                             "how long a write's Idempotency-Key is kept: a retry with the "
                                             "same key and body within it gets the first answer and runs "
                                             "nothing; then the key is purged")
    idempotency_max_keys: Count = limit(1_000_000, "HOPLINE_IDEMPOTENCY_MAX_KEYS",
                                        "Idempotency-Keys kept in the store (every daemon's together; "
                                        "expired ones are purged first; then a keyed write answers 503)")

    # fixed values: constants, no variable reads them
    transcript_page_envelope_bytes = fixed(64, Unit.BYTES,
                                           "room reserved in a transcript page for its JSON envelope "
                                           "(events list, nextCursor)")
    serve_stop_grace_seconds = fixed(5.0, Unit.SECONDS,
                                     "a stopping daemon's time to finish its open requests (whole seconds, "
                                     "rounded up)")
    path_id_max_chars = fixed(128, Unit.COUNT,
                              "a session or request id in a path (longer: 404 before any lookup)")
    idempotency_key_max_chars = fixed(255, Unit.COUNT,
                                      "characters of an Idempotency-Key header (printable ASCII; longer: "
                                      "400)")


class DaemonSseLimits(HopSettings, hop=HOP_DAEMON_SSE):
    """Hop 1: the daemon's event streams, their subscribers' queues and the replay ring."""

    sse_max_event_bytes: Bytes = limit(16 * MiB, "HOPLINE_SSE_MAX_EVENT_BYTES",
                                       "largest SSE event the daemon emits")
    sse_queue_max_events: Count = limit(256, "HOPLINE_SSE_QUEUE_MAX_EVENTS",
                                        "per-subscriber queue (clients may choose maxQueued in [16, 2048])",
                                        ge=16, le=2048)
    sse_queue_max_bytes: Bytes = limit(2 * MiB, "HOPLINE_SSE_QUEUE_MAX_BYTES",
                                       "per-subscriber queue bytes (not client-settable)")
    sse_heartbeat_seconds: Seconds = limit(15.0, "HOPLINE_SSE_HEARTBEAT_SECONDS",
                                           "SSE heartbeat comment interval", ge=0.01)
    sse_catch_up_seconds: Seconds = limit(0.1, "HOPLINE_SSE_CATCH_UP_SECONDS",
                                          "how long a session's pipe reader waits, before its next read, "
                                          "for a subscriber past half its queue to catch up (one that does "
                                          "not is then evicted as its queue fills)", ge=0)
    ring_max_events: Count = limit(8000, "HOPLINE_RING_MAX_EVENTS", "replay ring per session, events")
    ring_max_bytes: Bytes = limit(8 * MiB, "HOPLINE_RING_MAX_BYTES", "replay ring per session, bytes")
    max_subscribers_per_session: Count = limit(32, "HOPLINE_MAX_SUBSCRIBERS_PER_SESSION",
                                               "concurrent SSE streams of one session (then 429)")

    # fixed values: constants, no variable reads them
    sse_event_envelope_bytes = fixed(1 * KiB, Unit.BYTES,
                                     "room reserved in an SSE event for the envelope around an update (id "
                                     "and event lines, promptId)")
    stub_title_max_chars = fixed(128, Unit.COUNT,
                                 "characters of a tool title kept in the stub of an update over the SSE "
                                 "event limit")


class ClientSseLimits(HopSettings, hop=HOP_CLIENT_SSE):
    """Hop 1: a client reading a session's events."""

    client_sse_max_event_bytes: Bytes = limit(16 * MiB, "HOPLINE_CLIENT_SSE_MAX_EVENT_BYTES",
                                              "SSE event, client reader")
    client_sse_reconnect_attempts: Count = limit(8, "HOPLINE_CLIENT_SSE_RECONNECT_ATTEMPTS",
                                                 "failed SSE reconnects in a row before giving up", ge=0)
    client_sse_reconnect_backoff_seconds: Seconds = limit(0.1, "HOPLINE_CLIENT_SSE_RECONNECT_BACKOFF",
                                                          "first SSE reconnect backoff (doubles, capped at "
                                                          "x32)", ge=0)


class ReplayLimits(HopSettings, hop=HOP_REPLAY):
    """An agent's bulk replay of a session's history (session/load)."""

    bulk_replay_max_updates: Count = limit(10_000, "HOPLINE_BULK_REPLAY_MAX_UPDATES",
                                           "bulk replay (session load), updates")
    bulk_replay_max_bytes: Bytes = limit(32 * MiB, "HOPLINE_BULK_REPLAY_MAX_BYTES",
                                         "bulk replay (session load), bytes")

    # fixed values: constants, no variable reads them
    bulk_page_envelope_bytes = fixed(256, Unit.BYTES,
                                     "room reserved in an agent's bulk replay page for the JSON-RPC "
                                     "response around it")
