"""The gateway is a separate app: the import contract that says so names every other top-level
module of hopline, so a module added later is held by it too, and only daemon/embedded_gateway.py
is let through."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import hopline

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "the gateway is a separate app: only daemon/embedded_gateway.py imports it"


def _contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"] == CONTRACT)


def test_the_contract_holds_every_other_top_level_module() -> None:
    contract = _contract()
    top = {f"hopline.{m.name}" for m in pkgutil.iter_modules(hopline.__path__)} - {"hopline.__main__"}
    assert contract["forbidden_modules"] == ["hopline.gateway"]
    assert set(contract["source_modules"]) == top - {"hopline.gateway"}


def test_only_the_embedded_gateway_is_let_through() -> None:
    assert _contract()["ignore_imports"] == ["hopline.daemon.embedded_gateway -> hopline.gateway.**"]
