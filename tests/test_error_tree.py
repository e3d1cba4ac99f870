"""One error tree: every exception class hopline defines derives from ``HoplineError``; the classes
more than one package names live in ``hopline/errors.py``, each under a middle base."""

from __future__ import annotations

import importlib
import inspect
import io
import pkgutil
import tokenize
from collections import defaultdict
from pathlib import Path

import hopline
from hopline import errors
from hopline.budget import HoplineError

# Exceptions that must not be hopline errors, each with its reason (none today).
NOT_HOPLINE_ERRORS: dict[str, str] = {}
MIDDLE_BASES = (errors.ConfigError, errors.LimitExceeded, errors.InputError, errors.StoreError,
                errors.AgentError, errors.ClusterError, errors.ClientError, errors.InternalError)
# Exceptions directly under HoplineError, each with its reason.
OUTSIDE_THE_MIDDLE: dict[str, str] = {
    "hopline.daemon.errors.SessionError": "a daemon route's answer: its status, chosen where it is "
                                          "raised, says input (4xx), an agent or the store (5xx)",
    "hopline.daemon.sessions.keys.Replayed": "no error: the first answer to an idempotency key, given "
                                             "again out of the key's claim (before the write runs, or "
                                             "after another daemon stored the key)",
}
SOURCE = Path(hopline.__file__).parent


def _hopline_modules() -> list[str]:
    """Every module of the package but ``__main__`` (importing it runs the command line)."""
    names = (m.name for m in pkgutil.walk_packages(hopline.__path__, "hopline."))
    return ["hopline", *(n for n in names if not n.endswith(".__main__"))]


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class hopline defines, by its qualified name."""
    found: dict[str, type[BaseException]] = {}
    for name in _hopline_modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def _package(path: Path) -> str:
    """The top-level package (or module) of hopline a source file belongs to."""
    return path.relative_to(SOURCE).parts[0].removesuffix(".py")


def _packages_naming() -> dict[str, set[str]]:
    """Each identifier of the sources (code only: no string, no comment) -> the packages using it."""
    naming: dict[str, set[str]] = defaultdict(set)
    for path in SOURCE.rglob("*.py"):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text("utf-8")).readline)
        for token in tokens:
            if token.type == tokenize.NAME:
                naming[token.string].add(_package(path))
    return naming


def test_every_exception_class_hopline_defines_is_a_hopline_error() -> None:
    defined = _exception_classes()
    strays = [name for name, cls in defined.items()
              if not issubclass(cls, HoplineError) and name not in NOT_HOPLINE_ERRORS]
    assert len(defined) > 20  # the walk found the tree (budget, wire, harness, daemon, gate, ...)
    assert strays == []


def test_a_class_more_than_one_package_names_lives_in_errors() -> None:
    """A package's own exception stays with it; one another package raises, catches or subclasses
    is in hopline/errors.py, and one there is named by two packages at least (else it goes home)."""
    naming = _packages_naming()
    misplaced, lonely = [], []
    for name, cls in _exception_classes().items():
        users = naming[cls.__name__] - {"errors"}
        if cls.__module__ != "hopline.errors":
            if len(users) > 1:
                misplaced.append((name, sorted(users)))
        elif cls is not HoplineError and cls not in MIDDLE_BASES and len(users) < 2:
            lonely.append((name, sorted(users)))
    assert misplaced == [], "named by several packages: move to hopline/errors.py"
    assert lonely == [], "named by one package: move it into that package"


def test_every_error_in_errors_is_under_a_middle_base() -> None:
    """The tree has a middle layer (configuration, limits, input, store, agent, cluster, client,
    hopline's own rules)."""
    for name, cls in vars(errors).items():
        if not (inspect.isclass(cls) and issubclass(cls, BaseException)) or cls.__module__ != errors.__name__:
            continue
        if cls is HoplineError or cls in MIDDLE_BASES:
            continue
        assert issubclass(cls, MIDDLE_BASES), name
    assert all(base.__bases__[0] is HoplineError for base in MIDDLE_BASES)


def test_every_error_of_a_package_is_under_a_middle_base() -> None:
    """A class a single package keeps is placed in the tree too: under the middle base it belongs to."""
    outside = sorted(name for name, cls in _exception_classes().items()
                     if cls is not HoplineError and cls not in MIDDLE_BASES
                     and not issubclass(cls, MIDDLE_BASES))
    assert outside == sorted(OUTSIDE_THE_MIDDLE)
