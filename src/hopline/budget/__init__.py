"""The budget (SPEC B): hopline's configuration, each setting declared once.

- :mod:`.declare`: how a setting is declared: a typed field of its hop's model (its variable,
  default, bounds, unit and description), a fixed value (a named constant), the unit types;
- :mod:`.hops`: one model per hop (``PipeLimits``, ``GatewayLimits``...), whose fields are the table;
- :mod:`.table`: the table as the models declare it (:data:`CEILINGS`, :data:`FIXED`);
- :mod:`.model`: :class:`Budget`, the hop models gathered, and the coherence rules (B-4) as its
  model validators;
- :mod:`.settings`: the settings that are URLs or a credential (:class:`Settings`), :func:`redact_url`;
- :mod:`.variables`: every other variable hopline reads, each name spelled once;
- :mod:`.coherence`: :func:`check_coherence`, :func:`require_coherent`, :func:`limits_json`;
- :mod:`.environment`: the warnings for a variable hopline ignores (a fixed value's name, a typo);
- :mod:`.reference`: ``docs/configuration.md`` (``hopline limits --markdown``);
- :mod:`.ceiling`: :class:`Ceiling`, its :class:`Unit`, and the byte sizes settings are written in.

Every public name is re-exported here, so ``from hopline.budget import X`` serves every caller; the
modules of this package import each other, never this one (no import circle). The package imports
nothing of ours but the error tree.
"""

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
from hopline.budget.coherence import check_coherence, limits_json, require_coherent
from hopline.budget.environment import KNOWN_NAMES, environment_warnings
from hopline.budget.hops import HOP_MODELS
from hopline.budget.model import COHERENCE_RULES, Budget, CoherenceFinding
from hopline.budget.reference import common_table, reference_markdown
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
    FIXED,
    MAX_QUEUED_RANGE,
    REQUEST_PATH,
    SCRIPTED_SEED_RANGE,
)
from hopline.budget.variables import (
    AGENT_ENV,
    COMPILED_ENV,
    CREDENTIAL_ENV,
    DATA_DIR_ENV,
    EXTRA_HEADERS_ENV,
    GATEWAY_URL_ENV,
    HOPLINE_ENV_PREFIX,
    HOPLINE_TOKEN_ENV,
    INTERNAL_TOKEN_ENV,
    MODEL_ENV,
    NAIVE_ENV,
    OPENAI_API_KEY_ENV,
    OPENAI_BASE_URL_ENV,
    PERMISSION_MODE_ENV,
    PROVIDER_ENV,
    SERVER_TOKEN_ENV,
    SIDECAR_DIR_ENV,
    SIDECAR_WRITE_TOKEN_ENV,
    STREAM_ENV,
    URL_ENV,
    VARIABLES,
    Variable,
)
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
    BudgetError,
    HoplineError,
    IncoherentBudget,
    LimitExceeded,
)

__all__ = [
    "AGENT_ENV",
    "CEILINGS",
    "CEILINGS_BY_KEY",
    "COHERENCE_RULES",
    "COMPILED_ENV",
    "CREDENTIAL_ENV",
    "DATA_DIR_ENV",
    "EXTRA_HEADERS_ENV",
    "FIXED",
    "GATEWAY_URL_ENV",
    "HOPLINE_ENV_PREFIX",
    "HOPLINE_TOKEN_ENV",
    "HOP_CLIENT_SSE",
    "HOP_CLUSTER",
    "HOP_CONTEXT",
    "HOP_DAEMON_API",
    "HOP_DAEMON_SSE",
    "HOP_ENGINE",
    "HOP_GATE",
    "HOP_GATEWAY",
    "HOP_JOURNAL",
    "HOP_MODELS",
    "HOP_OBSERVE",
    "HOP_PIPE",
    "HOP_PROVIDER",
    "HOP_REPLAY",
    "HOP_SIDECARS",
    "HOP_TOOLS",
    "INTERNAL_TOKEN_ENV",
    "KNOWN_NAMES",
    "MAX_QUEUED_RANGE",
    "MAX_SIZE_BYTES",
    "MODEL_ENV",
    "NAIVE_ENV",
    "OPENAI_API_KEY_ENV",
    "OPENAI_BASE_URL_ENV",
    "PERMISSION_MODE_ENV",
    "PROVIDER_ENV",
    "REQUEST_PATH",
    "SCRIPTED_SEED_RANGE",
    "SECRET_SETTINGS_ENV",
    "SERVER_TOKEN_ENV",
    "SETTINGS",
    "SETTINGS_BY_KEY",
    "SIDECAR_DIR_ENV",
    "SIDECAR_WRITE_TOKEN_ENV",
    "STREAM_ENV",
    "URL_ENV",
    "VARIABLES",
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
    "Variable",
    "check_coherence",
    "common_table",
    "environment_warnings",
    "format_size",
    "limits_json",
    "parse_size",
    "redact_url",
    "reference_markdown",
    "require_coherent",
]
