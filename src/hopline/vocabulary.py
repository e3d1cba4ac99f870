"""The names more than one package speaks: SSE event types, ``_meta`` keys and extension methods.
Each is spelled here once; the modules that use a name import it (environment variables are
declared with the settings, in :mod:`hopline.budget`).

Imports nothing: any folder may use it (``budget`` does not need it).
"""

from __future__ import annotations

# --- SSE event types of GET /session/{id}/events (SPEC D-3) ------------------------------------
# With an id (journaled):
SESSION_UPDATE = "session_update"
PROGRESS = "progress"
COMPACTION = "compaction"
TURN_COMPLETE = "turn_complete"
TURN_ERROR = "turn_error"
PERMISSION_REQUEST = "permission_request"
# A permission request answered: by the client, by a cancel, by its deadline, or ended by the agent's exit.
PERMISSION_RESOLVED = "permission_resolved"
RESOLVED_BY_CLIENT = "client"
RESOLVED_BY_CANCEL = "cancel"
RESOLVED_BY_TIMEOUT = "timeout"
RESOLVED_BY_AGENT_EXIT = "agent_exited"
CANCEL_REQUESTED = "cancel_requested"  # journaled before session/cancel goes to the agent (T-1)
TURN_END_TYPES = frozenset({TURN_COMPLETE, TURN_ERROR})
# Without an id (synthetic: live subscribers only, never journaled):
REPLAY_COMPLETE = "replay_complete"
SLOW_CLIENT_WARNING = "slow_client_warning"
CLIENT_EVICTED = "client_evicted"
STATE_RESYNC_REQUIRED = "state_resync_required"
STREAM_ERROR = "stream_error"
FRAME_DROPPED = "frame_dropped"
DATA_CORRUPT = "data_corrupt"  # a stored event that failed its check on read: its id and why (T-3)
SIDECAR_DELAYED = "sidecar_delayed"  # a large update waits for its sidecar write (a slow or hung store)
# With an id, several daemons only (SPEC X): another daemon took the session over.
SESSION_ADOPTED = "session_adopted"
# With an id: the daemon stopped an idle session's agent (HOPLINE_SESSION_IDLE_SECONDS); a load restores it.
SESSION_REAPED = "session_reaped"
# With an id: the agent that ignored a cancel was replaced by a new one (how its memory was restored).
AGENT_RESTARTED = "agent_restarted"
SYNTHETIC_TYPES = frozenset({REPLAY_COMPLETE, SLOW_CLIENT_WARNING, CLIENT_EVICTED, STATE_RESYNC_REQUIRED,
                             STREAM_ERROR, FRAME_DROPPED, DATA_CORRUPT, SIDECAR_DELAYED})

# --- ACP ``_meta`` keys ---------------------------------------------------------------------------
META_PROFILE = "hopline.profile"
META_PERMISSION_MODE = "hopline.permissionMode"
META_SCRIPTED = "hopline.scripted"
META_TURN = "hopline.turn"
META_CREDENTIALS = "hopline.credentials"  # session/new, session/load: this session's secrets
# initialize answer ``_meta``: true when the agent is hopline's own and takes META_CREDENTIALS (T-8).
META_TAKES_CREDENTIALS = "hopline.takesCredentials"
CREDENTIAL_GATEWAY_TOKEN = "gatewayToken"  # the per-session llm-turn credential (D-11)
CREDENTIAL_SIDECAR_WRITE_TOKEN = "sidecarWriteToken"  # opens the session's sidecar store (S-3)
META_LOAD_REPLAY_MODE = "hopline.session.loadReplayMode"
META_LOAD_REPLAY = "hopline.session.loadReplay"
# Where a bulk replay may come back: ours, and qwen-code's spelling of the same envelope.
LOAD_REPLAY_META_KEYS = (META_LOAD_REPLAY, "qwen.session.loadReplay")
META_SIDECAR = "hopline.sidecar"  # fields moved to (or truncated for) a sidecar
META_TRUNCATED = "hopline.truncated"
META_DROPPED = "hopline.dropped"  # an update replaced by a stub over the SSE event limit
META_TOOL = "hopline.tool"
# A gate session's session/new: {"base", "head", "testCommand"?, "sandbox"?, "fix"?, "python"?}
# (harness.tools.ReviewRange).
REVIEW_META = "hopline.review"
# A tool message's _meta (read by programs, dropped before a provider): where a result was cut, and
# what a command's run ended with.
META_CUT = "hopline.cut"
META_COMMAND = "hopline.command"
META_TESTS = "hopline.tests"  # a run of the gate's test command: what ran, failed, was removed, coverage
META_DIFF = "hopline.diff"  # a whole-file git_diff: whether the file's behaviour (its AST) is the same
MESSAGE_META = "_meta"

# --- ACP extension methods, as they travel on the pipe (the SDK adds the leading "_") ---------------
LOAD_UPDATES_METHOD = "_hopline/session/loadUpdates"
PROGRESS_METHOD = "_hopline/progress"
SESSION_UPDATE_METHOD = "session/update"
PERMISSION_METHOD = "session/request_permission"

# --- the streaming form of llm-turn (gateway <-> the harness's HTTP model, SPEC G-5) ----------------
NDJSON_MEDIA_TYPE = "application/x-ndjson"
LINE_DELTA = "delta"
LINE_MESSAGE = "message"
LINE_ERROR = "error"

# --- several daemons (SPEC X) ----------------------------------------------------------------------
FORWARDED_BY_HEADER = "x-hopline-forwarded-by"  # a write forwarded to its owner: the sender's id
REASON_OWNER_LOST = "owner_lost"  # turn_error of a prompt whose daemon died (its lease expired)

# --- idempotent writes (SPEC T-12): the SDK sends the key, the daemon stores it ---------------------
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"  # "true" on an answer given again, the write not run again

# --- journal streams that are not sessions -------------------------------------------------------
# A gate run's events are a journaled stream of their own (its id is the stream's key); its row in
# the journal's sessions says so, and no session route serves it.
STREAM_KIND = "streamKind"
STREAM_KIND_GATE = "gate"

# --- the gate workflow (SPEC K): its agents and its stream's event types ----------------------------
GATE_AGENTS: tuple[str, ...] = ("qa_automation", "qa_performance_security", "qa_strategy", "appsec")
GATE_STARTED = "gate_started"
GATE_ROUND = "gate_round"
GATE_ITEM = "gate_item"
GATE_PROGRESS = "gate_progress"
GATE_VERDICT = "gate_verdict"
GATE_FIX = "gate_fix"  # a dev fix's outcome: its commit and how it was verified, or why it failed
DEV_STATE = "dev_state"
GATE_COMPLETE = "gate_complete"
# The first line of a gate prompt and of a fix prompt, and the line naming the test command: what the
# gate writes (gate.prompts) and the offline reviewer reads (hopline.scripted).
GATE_REVIEW_MARKER = "hopline gate review"
FIX_MARKER = "hopline gate fix"
TEST_COMMAND_MARKER = "hopline gate test command:"
GATE_EVENT_TYPES: tuple[str, ...] = (GATE_STARTED, GATE_ROUND, GATE_ITEM, GATE_PROGRESS, GATE_VERDICT,
                                     GATE_FIX, DEV_STATE, GATE_COMPLETE)


def gate_vocabulary() -> dict[str, object]:
    """What the console reads of the gate's names (``GET /gate/vocabulary``): spelled here only.
    ``events`` maps each constant's name (``GATE_ROUND``) to the event type it stands for."""
    return {"agents": list(GATE_AGENTS),
            "events": {name: value for name, value in globals().items()
                       if isinstance(value, str) and value in GATE_EVENT_TYPES}}
