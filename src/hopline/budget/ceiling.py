"""A limit as declared (SPEC B-1): :class:`Ceiling`, its :class:`Unit`, and the byte sizes a setting
is written in (``10mb``, ``8MiB``, ``262144``).

This module imports nothing of ours but the error tree.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from hopline.errors import BudgetError, LimitExceeded

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# The largest size we accept from a setting: above this a value is an overflow, not a ceiling.
MAX_SIZE_BYTES = 2**62

# 1024-based, as in the `bytes` npm library that Express uses (`10mb` = 10,485,760).
_SIZE_UNITS: Mapping[str, int] = {
    "": 1,
    "b": 1,
    "kb": KiB,
    "kib": KiB,
    "mb": MiB,
    "mib": MiB,
    "gb": GiB,
    "gib": GiB,
    "tb": 1024 * GiB,
    "tib": 1024 * GiB,
}
_SIZE_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int) -> int:
    """Parse a byte size: a plain integer (bytes) or a number with a 1024-based unit.

    Units are case-insensitive (`b`, `kb`, `mb`, `gb`, `tb`, `KiB`, `MiB`, `GiB`, `TiB`) and
    surrounding spaces are allowed. Fractions are floored to whole bytes, as the `bytes` library
    does. Raises ``ValueError`` for anything else, including negatives and overflow.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        number = Decimal(value)
        unit = ""
    else:
        match = _SIZE_RE.match(value)
        if match is None:
            raise ValueError(f"not a size: {value!r} (expected e.g. 10mb, 8MiB, 262144)")
        try:
            number = Decimal(match.group(1))
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
            raise ValueError(f"not a size: {value!r}") from exc
        unit = match.group(2).lower()
    if number < 0:
        raise ValueError(f"negative size: {value!r}")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {value!r} (use b, kb, mb, gb, KiB, MiB, GiB)")
    size = int(number * _SIZE_UNITS[unit])
    if size > MAX_SIZE_BYTES:
        raise ValueError(f"size overflow: {value!r} is more than {MAX_SIZE_BYTES} bytes")
    return size


def format_size(size: int) -> str:
    """Human units for a byte count, exact when it is a whole number of units (`8 MiB`)."""
    for unit, factor in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= factor:
            if size % factor == 0:
                return f"{size // factor} {unit}"
            return f"{size / factor:.2f} {unit}"
    return f"{size} B"


class Unit(enum.Enum):
    BYTES = "bytes"
    TOKENS = "tokens"
    COUNT = "count"
    RATIO = "ratio"
    SECONDS = "seconds"


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """One limit as its declaration states it (:func:`hopline.budget.declare.ceiling_of`): its key on
    :class:`~hopline.budget.Budget`, hop, unit, default, variable (``None``: a fixed value), bounds."""

    key: str
    hop: str
    unit: Unit
    default: int | float
    env: str | None
    description: str
    minimum: int | float = 1
    maximum: int | float | None = None
    common: bool = False  # one of the few settings a person sets

    @property
    def name(self) -> str:
        """The public name: the variable, or a fixed value's upper-cased key."""
        return self.env or self.key.upper()

    @property
    def fixed(self) -> bool:
        return self.env is None

    def exceeded(self, limit: int | float, observed: int | float, message: str | None = None, *,
                 hop: str | None = None, kind: str = "ceiling_exceeded", **extra: Any) -> LimitExceeded:
        """The :class:`~hopline.errors.LimitExceeded` of this ceiling, a size or a count alike (its
        hop unless ``hop`` names another; its unit): the one constructor of a limit error."""
        return LimitExceeded(hop or self.hop, self.name, limit, observed, message, unit=self.unit.value,
                             kind=kind, **extra)

    def validate(self, value: int | float) -> None:
        """Within this ceiling's bounds, or :class:`BudgetError` naming it."""
        if value < self.minimum:
            raise BudgetError(f"{self.name}={value!r}: must be at least {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise BudgetError(f"{self.name}={value!r}: must be at most {self.maximum}")
