"""Count what a newcomer meets: environment variable names spelled in the code, and exception classes
and the modules that define them. Runs on any checkout's sources, so a change's before and after
are measured the same way:

    python tools/declarations.py src
    git archive <rev> src | tar -x -C /tmp/before && python tools/declarations.py /tmp/before/src

A name is counted where a string literal is exactly a variable's name (``HOPLINE_*``, ``OPENAI_*``,
``AWS_*``, ``API_JSON_*``), in Python (an ``__all__`` entry is a Python name, not counted) and in the
console's JavaScript. The exception classes are found by importing every module of that tree.
"""

from __future__ import annotations

import ast
import collections
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

_NAME = re.compile(r"(HOPLINE|OPENAI|API_JSON|AWS)_[A-Z0-9_]+")
_JS_NAME = re.compile(r"['\"`]((?:HOPLINE|OPENAI|API_JSON|AWS)_[A-Z0-9_]+)['\"`]")


def spelled_names(package: Path) -> tuple[collections.Counter[str], set[Path]]:
    spelled: collections.Counter[str] = collections.Counter()
    files: set[Path] = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text("utf-8"))
        exported = {id(element) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                    for element in getattr(node.value, "elts", [])}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.fullmatch(node.value)
                    and id(node) not in exported):
                spelled[node.value] += 1
                files.add(path)
    for path in package.rglob("*.js"):
        for match in _JS_NAME.finditer(path.read_text("utf-8")):
            spelled[match.group(1)] += 1
            files.add(path)
    return spelled, files


def exception_classes(source: Path) -> dict[str, list[str]]:
    sys.path.insert(0, str(source))
    import hopline

    names = ["hopline", *(m.name for m in pkgutil.walk_packages(hopline.__path__, "hopline.")
                          if not m.name.endswith(".__main__"))]
    found: dict[str, list[str]] = collections.defaultdict(list)
    for name in names:
        for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found[name].append(cls.__name__)
    return found


def main() -> None:
    source = Path(sys.argv[1] if len(sys.argv) > 1 else "src").resolve()
    spelled, files = spelled_names(source / "hopline")
    twice = sorted(name for name, count in spelled.items() if count > 1)
    print(f"variable names: {len(spelled)} distinct, {sum(spelled.values())} literal spellings in "
          f"{len(files)} files; spelled more than once: {len(twice)} {twice}")
    found = exception_classes(source)
    print(f"exception classes: {sum(map(len, found.values()))} in {len(found)} modules "
          f"({len(found.get('hopline.errors', []))} in hopline/errors.py)")


if __name__ == "__main__":
    main()
