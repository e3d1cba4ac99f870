"""What the environment holds that hopline will not use, said rather than silently ignored: a fixed
value's name (fixed values are no settings) and a ``HOPLINE_*`` variable that names no setting (a
typo), with the closest real name."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from hopline.budget.ceiling import Ceiling, Unit, format_size
from hopline.budget.settings import SETTINGS
from hopline.budget.table import CEILINGS, FIXED
from hopline.budget.variables import HOPLINE_ENV_PREFIX, VARIABLES

# Every variable hopline reads: the limits', the settings', and the others (hopline.budget.variables).
KNOWN_NAMES: frozenset[str] = frozenset({c.env for c in CEILINGS if c.env is not None}
                                        | {s.env for s in SETTINGS}
                                        | {v.name for v in VARIABLES})
# A fixed value's name, as someone would try to set it: its own, and with hopline's prefix.
_FIXED_NAMES: Mapping[str, Ceiling] = {name: c for c in FIXED
                                       for name in (c.name, HOPLINE_ENV_PREFIX + c.name)}


def shown_value(ceiling: Ceiling, value: int | float) -> str:
    """A value in its unit, as a person reads it (`8 MiB`, `30 s`, `0.7`)."""
    if ceiling.unit is Unit.BYTES:
        return format_size(int(value))
    if ceiling.unit is Unit.SECONDS:
        return f"{value:g} s"
    if ceiling.unit is Unit.TOKENS:
        return f"{value} tokens"
    return f"{value:g}" if isinstance(value, float) else str(value)


def environment_warnings(environ: Mapping[str, str]) -> list[str]:
    """One warning per variable of ``environ`` that hopline ignores although it looks like its own."""
    warnings: list[str] = []
    for name in sorted(environ):
        fixed = _FIXED_NAMES.get(name)
        if fixed is not None:
            warnings.append(f"{name} is ignored: {fixed.name} is a fixed value of {fixed.hop} "
                            f"({shown_value(fixed, fixed.default)}), not a setting")
        elif name.startswith(HOPLINE_ENV_PREFIX) and name not in KNOWN_NAMES:
            close = difflib.get_close_matches(name, sorted(KNOWN_NAMES), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.append(f"{name} is ignored: no hopline setting has this name{hint}")
    return warnings
