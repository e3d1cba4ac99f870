"""The SDK is a typed package (SPEC A-1): PEP 561's marker beside the code, and strict mypy on the
client and the budget it reads."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_carries_its_py_typed_marker() -> None:
    assert resources.files("hopline").joinpath("py.typed").is_file()


def test_mypy_checks_the_client_and_the_budget_with_every_strict_flag() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    strict = next(o for o in mypy["overrides"] if "hopline.client.*" in o["module"])
    assert "hopline.budget.*" in strict["module"]
    # mypy --strict's flags that a per-module section can set (the others are global only).
    for flag in ("disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls",
                 "disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs",
                 "disallow_untyped_decorators", "warn_return_any", "no_implicit_reexport",
                 "strict_equality", "extra_checks"):
        assert strict.get(flag) is True, flag
    assert mypy["warn_unused_ignores"] is True
