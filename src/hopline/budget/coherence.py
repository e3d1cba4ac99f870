"""Coherence of the ceilings (SPEC B-4), as a component acts on it: :func:`check_coherence` (the
findings :class:`~hopline.budget.Budget`'s rules made), :func:`require_coherent`, which refuses to
start on an error, and :func:`limits_json` (``hopline limits --json``, the ``budget`` of
``/daemon/status``)."""

from __future__ import annotations

from hopline.budget.ceiling import Unit
from hopline.budget.model import Budget, CoherenceFinding
from hopline.budget.settings import SETTINGS, Settings
from hopline.budget.table import CEILINGS, FIXED
from hopline.errors import IncoherentBudget


def check_coherence(budget: Budget) -> list[CoherenceFinding]:
    """Every coherence finding of ``budget``; errors first."""
    return budget.findings


def require_coherent(budget: Budget) -> list[CoherenceFinding]:
    """Raise :class:`IncoherentBudget` on any error; return the warnings."""
    findings = check_coherence(budget)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise IncoherentBudget(errors)
    return findings


def limits_json(budget: Budget, findings: list[CoherenceFinding],
                settings: Settings | None = None) -> dict[str, object]:
    """Every ceiling in force, where it came from, the fixed values, and the coherence findings:
    `hopline limits --json` and the ``budget`` of ``GET /daemon/status``; with ``settings``, the
    settings too (shown without secrets)."""
    ceilings: list[dict[str, object]] = []
    for c in CEILINGS:
        row: dict[str, object] = {"name": c.name, "hop": c.hop}
        if c.unit is Unit.BYTES:
            row["bytes"] = budget.value(c.key)
        else:
            row["value"] = budget.value(c.key)
            row["unit"] = c.unit.value
        row["source"] = budget.source(c.key)
        ceilings.append(row)
    doc: dict[str, object] = {
        "ceilings": ceilings,
        "fixed": [{"name": c.name, "hop": c.hop, "value": budget.value(c.key), "unit": c.unit.value}
                  for c in FIXED],
        "narrowestRequestCeiling": budget.narrowest_request_ceiling().name,
        "errors": [f.to_json() for f in findings if f.severity == "error"],
        "warnings": [f.to_json() for f in findings if f.severity == "warning"],
    }
    if settings is not None:
        doc["settings"] = [{"name": s.name, "option": s.option, "value": settings.shown(s.key),
                            "source": settings.source(s.key)} for s in SETTINGS]
    return doc
