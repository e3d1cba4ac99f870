"""Every package hopline installs is one it uses: each runtime dependency is imported by
``src/hopline`` or run as a program by the gate; what only the tests use is in the dev extra."""

from __future__ import annotations

import ast
import re
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Installed for their commands: the gate's analyzers run them (harness/analyzers.py), never import them.
PROGRAMS = {"ruff", "detect-secrets"}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported_distributions() -> set[str]:
    modules: set[str] = set()
    for path in (ROOT / "src" / "hopline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    owners = packages_distributions()
    return {_name(dist) for module in modules for dist in owners.get(module, [])}


def test_every_runtime_dependency_is_imported_by_hopline_or_run_by_the_gate() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    unused = runtime - _imported_distributions() - PROGRAMS
    assert not unused, f"runtime dependencies hopline never imports (test-only ones go to dev): {unused}"
    assert "sse-starlette" not in runtime


def test_the_checker_sees_hoplines_imports() -> None:
    # Guards the mapping from import names to distributions: acp is agent-client-protocol's.
    expected = {"fastapi", "agent-client-protocol", "prometheus-client", "psycopg-pool"}
    assert expected <= _imported_distributions()
