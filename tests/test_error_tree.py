"""One error tree (#16): every exception class hopline defines derives from ``HoplineError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import hopline
from hopline.budget import HoplineError

# Exceptions that must not be hopline errors, each with its reason (none today).
NOT_HOPLINE_ERRORS: dict[str, str] = {}


def _hopline_modules() -> list[str]:
    """Every module of the package but ``__main__`` (importing it runs the command line)."""
    names = (m.name for m in pkgutil.walk_packages(hopline.__path__, "hopline."))
    return ["hopline", *(n for n in names if not n.endswith(".__main__"))]


def test_every_exception_class_hopline_defines_is_a_hopline_error() -> None:
    defined: list[str] = []
    strays: list[str] = []
    for name in _hopline_modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            qualified = f"{name}.{cls.__qualname__}"
            defined.append(qualified)
            if not issubclass(cls, HoplineError) and qualified not in NOT_HOPLINE_ERRORS:
                strays.append(qualified)
    assert len(defined) > 20  # the walk found the tree (budget, wire, harness, daemon, gate, ...)
    assert strays == []
