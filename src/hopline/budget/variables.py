"""The variables hopline reads that are neither a limit nor a setting of a hop's model: the provider,
the tokens, the data directory, the switches, and what hopline hands the processes it starts. Each
name is spelled here once; the modules that read one import its constant. :data:`VARIABLES` says what
each does (``hopline limits --markdown``, ``docs/configuration.md``).
"""

from __future__ import annotations

import dataclasses

# --- what you set --------------------------------------------------------------------------------
PROVIDER_ENV = "HOPLINE_PROVIDER"
MODEL_ENV = "HOPLINE_MODEL"
OPENAI_API_KEY_ENV = "OPENAI_API_KEY"
OPENAI_BASE_URL_ENV = "OPENAI_BASE_URL"
STREAM_ENV = "HOPLINE_PROVIDER_STREAM"
EXTRA_HEADERS_ENV = "HOPLINE_PROVIDER_EXTRA_HEADERS"
SERVER_TOKEN_ENV = "HOPLINE_SERVER_TOKEN"  # the daemon API's bearer token
INTERNAL_TOKEN_ENV = "HOPLINE_INTERNAL_TOKEN"  # the gateway's operator token
URL_ENV = "HOPLINE_URL"  # the daemon a client talks to (the SDK and every client command)
DATA_DIR_ENV = "HOPLINE_DATA_DIR"
AGENT_ENV = "HOPLINE_AGENT_ENV"  # the operator's list of variables passed to agent children
PERMISSION_MODE_ENV = "HOPLINE_PERMISSION_MODE"
NAIVE_ENV = "HOPLINE_NAIVE"
COMPILED_ENV = "HOPLINE_COMPILED"
AWS_ENDPOINT_URL_ENV = "AWS_ENDPOINT_URL"
AWS_ENDPOINT_URL_S3_ENV = "AWS_ENDPOINT_URL_S3"
AWS_REGION_ENV = "AWS_REGION"
AWS_DEFAULT_REGION_ENV = "AWS_DEFAULT_REGION"
AWS_ACCESS_KEY_ID_ENV = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
AWS_SESSION_TOKEN_ENV = "AWS_SESSION_TOKEN"

# --- what hopline sets for the processes it starts -----------------------------------------------
GATEWAY_URL_ENV = "HOPLINE_GATEWAY_URL"  # what an agent child posts llm-turns to
SIDECAR_DIR_ENV = "HOPLINE_SIDECAR_DIR"
SIDECAR_WRITE_TOKEN_ENV = "HOPLINE_SIDECAR_WRITE_TOKEN"

HOPLINE_ENV_PREFIX = "HOPLINE_"  # every setting of hopline's own (stores, tokens, limits) starts so
# hopline's own tokens: never handed to a child process, whatever the operator names (D-11).
HOPLINE_TOKEN_ENV: frozenset[str] = frozenset({SERVER_TOKEN_ENV, INTERNAL_TOKEN_ENV, SIDECAR_WRITE_TOKEN_ENV})
# ...and the provider key: never in a tool's environment. A third-party agent that calls its
# provider itself (qwen --acp) gets the key only when the operator names it (HOPLINE_AGENT_ENV).
CREDENTIAL_ENV: frozenset[str] = HOPLINE_TOKEN_ENV | {OPENAI_API_KEY_ENV}


@dataclasses.dataclass(frozen=True)
class Variable:
    """One variable: what it does, and who sets it (``you``, or ``hopline`` for a process it starts).
    ``common``: one of the few a person sets (the README shows them); ``secret``: a credential."""

    name: str
    description: str
    default: str = ""
    by: str = "you"
    secret: bool = False
    common: bool = False


VARIABLES: tuple[Variable, ...] = (
    Variable(PROVIDER_ENV, "the gateway's model provider: scripted (offline, deterministic) or openai (any "
             "OpenAI-compatible chat completions API)", "scripted", common=True),
    Variable(MODEL_ENV, "the provider's model", "gpt-4o-mini", common=True),
    Variable(OPENAI_API_KEY_ENV, "the provider's API key (the gateway's only; a tool never sees it)",
             secret=True, common=True),
    Variable(OPENAI_BASE_URL_ENV, "the provider's base URL", "https://api.openai.com/v1", common=True),
    Variable(STREAM_ENV, "1: ask the provider to stream its answer; 0: one whole answer", "1"),
    Variable(EXTRA_HEADERS_ENV, "a JSON object of headers added to every provider request"),
    Variable(SERVER_TOKEN_ENV, "the daemon API's bearer token (hopline serve, and the commands that talk to "
             "a daemon)", "a fresh one per serve, printed", secret=True, common=True),
    Variable(URL_ENV, "the daemon a client talks to: the SDK's DaemonClient() and the client commands (run, "
             "sessions, status, sidecar, gate)", common=True),
    Variable(DATA_DIR_ENV, "where a daemon and its agents keep their state",
             "$XDG_DATA_HOME/hopline, else ~/.local/share/hopline", common=True),
    Variable(AGENT_ENV, "variables of the daemon's environment passed on to agent children, "
             "comma-separated (also --agent-env)", common=True),
    Variable(PERMISSION_MODE_ENV, "auto: hopline's agent approves its tools' permission requests itself "
             "(handed to agent children)"),
    Variable(INTERNAL_TOKEN_ENV, "the gateway's operator token (hopline gateway); serve makes one for "
             "its embedded gateway and hands it to its agents", "a fresh one", secret=True),
    Variable(NAIVE_ENV, "1: replay the seed's incident on purpose (its old rules; an incoherent budget "
             "runs)"),
    Variable(COMPILED_ENV, "0: run the source alone, never the compiled hot path", "1"),
    Variable(AWS_ENDPOINT_URL_S3_ENV, "an s3:// sidecar URL's endpoint (before AWS_ENDPOINT_URL)"),
    Variable(AWS_ENDPOINT_URL_ENV, "an s3:// sidecar URL's endpoint"),
    Variable(AWS_REGION_ENV, "an s3:// sidecar URL's region (before AWS_DEFAULT_REGION)"),
    Variable(AWS_DEFAULT_REGION_ENV, "an s3:// sidecar URL's region"),
    Variable(AWS_ACCESS_KEY_ID_ENV, "an s3:// sidecar URL's access key id"),
    Variable(AWS_SECRET_ACCESS_KEY_ENV, "an s3:// sidecar URL's secret access key", secret=True),
    Variable(AWS_SESSION_TOKEN_ENV, "an s3:// sidecar URL's session token", secret=True),
    Variable(GATEWAY_URL_ENV, "where an agent child posts its llm-turns", by="hopline"),
    Variable(SIDECAR_DIR_ENV, "an agent child's sidecar store (a daemon on the same machine)", by="hopline"),
    Variable(SIDECAR_WRITE_TOKEN_ENV, "opens that store for writing", by="hopline", secret=True),
)
