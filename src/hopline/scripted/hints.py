"""The scripted model's hints (``params["scripted"]``: ``seed``, ``toolsPerIteration``,
``iterations``, ``writeBytes``) and the summary's ``maxBytes``, as every boundary that takes them
checks them: the daemon's ``POST /session`` and ``POST /gate``, the agent's ``session/new``, the
gateway's llm-turn. Each numeric hint is bounded by a ceiling of the budget (B-5); unknown hints are
refused.
"""

from __future__ import annotations

from typing import Any

from hopline.budget import CEILINGS_BY_KEY, SCRIPTED_SEED_RANGE, Budget
from hopline.errors import InputRefused

# Each hint and the budget ceiling that bounds it (the hint ``seed`` is not a cost: a fixed range).
HINT_CEILINGS: dict[str, str | None] = {
    "seed": None,
    "toolsPerIteration": "scripted_max_tools_per_iteration",
    "iterations": "scripted_max_iterations",
    "writeBytes": "scripted_max_write_bytes",
}


def _hint_range(budget: Budget, key: str | None) -> tuple[int, int, str | None]:
    if key is None:
        return SCRIPTED_SEED_RANGE[0], SCRIPTED_SEED_RANGE[1], None
    return 0, int(budget.value(key)), CEILINGS_BY_KEY[key].name


def scripted_hints(raw: Any, budget: Budget, *, field: str = "scripted",
                   unknown: bool = False) -> dict[str, Any]:
    """The scripted model's hints, each an integer within its budget bound; else
    :class:`InputRefused` (``invalid_hint``) naming the hint (under ``field``), its bound and the
    value seen. Unknown hints are refused, unless ``unknown`` (the daemon relays the dict to any ACP
    agent, which may read keys of its own; hopline's agent refuses them itself)."""
    if not isinstance(raw, dict):
        raise InputRefused("invalid_hint", "scripted hints must be an object", field=field)
    for name, value in raw.items():
        if name not in HINT_CEILINGS:
            if unknown:
                continue
            raise InputRefused("invalid_hint", f"unknown scripted hint {str(name)[:64]!r} (known: "
                               f"{', '.join(HINT_CEILINGS)})", field=f"{field}.{str(name)[:64]}")
        low, high, setting = _hint_range(budget, HINT_CEILINGS[name])
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputRefused("invalid_hint", f"scripted hint {name} must be an integer from {low} to "
                               f"{high}", field=f"{field}.{name}", limit=high)
        if not low <= value <= high:
            where = f" ({setting})" if setting else ""
            raise InputRefused("invalid_hint", f"scripted hint {name}={value} is outside {low}..{high}"
                               + where,
                               field=f"{field}.{name}", limit=high, observed=value, setting=setting)
    return dict(raw)


def check_model_params(params: Any, budget: Budget) -> None:
    """The client-settable model params the scripted model reads: ``scripted`` hints and the
    summary's ``maxBytes`` (at most ``HOPLINE_SUMMARY_MAX_BYTES``)."""
    if not isinstance(params, dict):
        return
    if "scripted" in params:
        scripted_hints(params["scripted"], budget, field="params.scripted")
    if "maxBytes" in params:
        value, limit = params["maxBytes"], budget.summary_max_bytes
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise InputRefused("invalid_hint", f"params.maxBytes must be an integer from 1 to {limit} "
                               f"({CEILINGS_BY_KEY['summary_max_bytes'].name})",
                               field="params.maxBytes", limit=limit)
