"""hopline's error tree root and the one shape of a limit passed (SPEC D-10).

Every exception hopline raises on purpose derives from :class:`HoplineError` (``tests/test_error_tree.py``
walks the package). Every limit any hop enforces, a byte size or a count, is refused with one
:class:`LimitExceeded` built by one constructor, :meth:`hopline.budget.Ceiling.exceeded` (the
ceiling names its setting, its hop and its unit), so a client handles "over a limit" once:

    {"error": {"type", "hop", "setting", "limit", "observed", "unit", "message", ...}}

``unit`` is the ceiling's (``bytes``, ``count``, ``tokens``, ``seconds``). A byte limit also carries
``limitBytes``, ``observedBytes`` and ``sizeError: true``, the keys of the first shape, because
clients in this repository still read them (the gate's report, the turn view, the console); they go
once those read ``limit`` / ``observed``.

This module imports nothing of ours: it is the bottom of every layer.
"""

from __future__ import annotations

from typing import Any

UNIT_BYTES = "bytes"


class HoplineError(Exception):
    """The base of every error hopline raises on purpose."""


class LimitExceeded(HoplineError):
    """A payload or a count passed a limit of the budget, on one hop.

    ``setting`` is the limit's public name (its env var); ``observed`` is the size or count seen, a
    lower bound when a payload was cut off as soon as it passed the limit. :meth:`to_json` is the
    one JSON shape of "over a limit" on every hop.
    """

    def __init__(self, hop: str, setting: str, limit: int | float, observed: int | float,
                 message: str | None = None, *, unit: str = UNIT_BYTES, kind: str = "ceiling_exceeded",
                 **extra: Any) -> None:
        self.hop = hop
        self.setting = setting
        self.limit = limit
        self.observed = observed
        self.unit = unit
        self.kind = kind
        self.extra = extra
        self.message = message or (f"{hop}: {observed} {unit} exceed the limit of {limit} {unit} "
                                   f"({setting})")
        super().__init__(self.message)

    def fields(self) -> dict[str, Any]:
        """The limit fields every rendering carries (an error body, an event, a JSON-RPC error)."""
        fields: dict[str, Any] = {"hop": self.hop, "setting": self.setting, "limit": self.limit,
                                  "observed": self.observed, "unit": self.unit}
        if self.unit == UNIT_BYTES:  # the first shape's keys, still read by clients (see the module)
            fields.update(limitBytes=self.limit, observedBytes=self.observed, sizeError=True)
        return fields

    def limit_fields(self) -> dict[str, Any]:
        """:meth:`fields` without the hop, for an error body that names its hop itself."""
        return {key: value for key, value in self.fields().items() if key != "hop"}

    def to_json(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, **self.fields(), "message": self.message, **self.extra}}
