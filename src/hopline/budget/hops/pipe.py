"""The ACP pipe between the daemon and an agent child (hop 2), and its large-frame observer."""

from __future__ import annotations

from hopline.budget.ceiling import KiB, MiB, Unit
from hopline.budget.declare import Bytes, Count, HopSettings, Seconds, fixed, limit
from hopline.errors import HOP_OBSERVE, HOP_PIPE


class PipeLimits(HopSettings, hop=HOP_PIPE):
    """Hop 2: the ACP pipe between the daemon and an agent child."""

    # 32 MiB: the official TypeScript SDK's ndJsonStream refuses a larger message, so a frame
    # between that and a larger default would be refused by a stock client of `hopline agent`.
    pipe_max_frame_bytes: Bytes = limit(32 * MiB, "HOPLINE_PIPE_MAX_FRAME_BYTES",
                                        "ACP pipe max frame, daemon reader side (both directions)")
    agent_max_frame_bytes: Bytes = limit(32 * MiB, "HOPLINE_AGENT_MAX_FRAME_BYTES",
                                         "ACP pipe max frame, agent SDK reader side (must equal the "
                                         "daemon's)")
    child_stderr_line_max_bytes: Bytes = limit(8 * KiB, "HOPLINE_CHILD_STDERR_LINE_MAX_BYTES",
                                               "one drained stderr line of a child")
    child_stop_grace_seconds: Seconds = limit(2.0, "HOPLINE_CHILD_STOP_GRACE_SECONDS",
                                              "a stopped child's time to exit after its stdin closes, then "
                                              "again after SIGTERM (then SIGKILL)", ge=0.01)
    pipe_write_timeout_seconds: Seconds = limit(30.0, "HOPLINE_PIPE_WRITE_TIMEOUT",
                                                "one write to a child's stdin (then the child is not "
                                                "reading: its session's prompts end with turn_error "
                                                "agent_not_reading and the child is stopped)", ge=0.01)
    agent_silence_seconds: Seconds = limit(600.0, "HOPLINE_AGENT_SILENCE_SECONDS",
                                           "a child that writes nothing this long while a request to it is "
                                           "pending (time spent waiting for a client's permission answer "
                                           "does not count) is stopped: its turn ends with turn_error "
                                           "agent_unresponsive", ge=0.01)
    cancel_grace_seconds: Seconds = limit(5.0, "HOPLINE_CANCEL_GRACE_SECONDS",
                                          "after POST /cancel, the agent's time to end its turn; then the "
                                          "daemon ends it (turn_complete, stopReason cancelled, origin "
                                          "daemon), stops the agent, and the next prompt starts a new one",
                                          ge=0.01)
    max_pending_permissions: Count = limit(32, "HOPLINE_MAX_PENDING_PERMISSIONS",
                                           "agent-initiated requests (permission requests) pending in one "
                                           "session (more: a JSON-RPC error to the child, counted)")
    max_pending_permission_bytes: Bytes = limit(4 * MiB, "HOPLINE_MAX_PENDING_PERMISSION_BYTES",
                                                "bytes the pending agent-initiated requests of one session "
                                                "hold, after projection (more: a JSON-RPC error to the "
                                                "child, counted)")
    agent_handshake_timeout_seconds: Seconds = limit(60.0, "HOPLINE_AGENT_HANDSHAKE_TIMEOUT",
                                                     "a child's answer to initialize, session/new, load",
                                                     ge=0.01)
    warm_children: Count = limit(1, "HOPLINE_WARM_CHILDREN",
                                 "started and initialized agent children kept ready per agent command (0: "
                                 "off)", ge=0, le=16)


class ObserveLimits(HopSettings, hop=HOP_OBSERVE):
    """The large-frame observer of the pipe."""

    large_frame_recent_records: Count = limit(50, "HOPLINE_LARGE_FRAME_RECENT_RECORDS",
                                              "latest large-frame records kept in memory for GET "
                                              "/daemon/frames (the console)", ge=0, le=1000)

    # fixed values: constants, no variable reads them
    large_frame_threshold_bytes = fixed(256 * KiB, Unit.BYTES,
                                        "large-frame attribution threshold (inclusive)")
    large_frame_log_quota = fixed(50, Unit.COUNT, "large-frame records per sampling window")
    large_frame_log_window_seconds = fixed(60.0, Unit.SECONDS, "large-frame sampling window")
