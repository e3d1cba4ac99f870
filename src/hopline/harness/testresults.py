"""Reading what a compile printed (``python -m py_compile``'s errors), and whether a Python change
leaves its behaviour's AST the same. Pure: no I/O (the offline reviewer, the ``git_diff`` tool and
the gate's fix check read through here; a test run is read by :mod:`hopline.harness.testruns`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

# py_compile: '  File "src/calc.py", line 3' then the source line, a caret, then "SyntaxError: ..."
_COMPILE_RE = re.compile(r'^\s*File "([^"]+)", line (\d+)\n(?:.*\n){0,3}?((?:\w+Error|\w+Exception)[^\n]*)',
                         re.MULTILINE)
# py_compile of Python 3.11: "Sorry: IndentationError: expected an indented block ... (src/calc.py, line 2)"
_SORRY_RE = re.compile(r"^Sorry: ((?:\w+Error|\w+Exception)[^\n]*?) \((.+), line (\d+)\)$", re.MULTILINE)


def parse_compile_errors(text: str, files: Sequence[str] = ()) -> list[tuple[str, int, str]]:
    """``(file, line, error)`` of each file ``python -m py_compile`` could not compile; a bare file
    name (Python 3.11's "Sorry: ... (calc.py, line 5)") is given back as the one of ``files`` it names."""
    found = [(file, int(line), error.strip()[:300]) for file, line, error in _COMPILE_RE.findall(text)]
    found += [(file, int(line), error.strip()[:300]) for error, file, line in _SORRY_RE.findall(text)]
    out: list[tuple[str, int, str]] = []
    for file, line, error in found:
        if "/" not in file:
            named = [f for f in files if f.rsplit("/", 1)[-1] == file]
            file = named[0] if len(named) == 1 else file
        if all((file, line) != (f, n) for f, n, _ in out):
            out.append((file, line, error))
    return out


# --- a change that leaves behaviour alone ------------------------------------------------------------

_TYPING_ONLY = frozenset({"typing", "typing_extensions", "__future__"})
_TYPE_FACTORIES = frozenset({"TypeVar", "ParamSpec", "TypeVarTuple", "NewType", "TypeAlias"})


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value,
                                                     ast.Constant) and isinstance(node.value.value, str)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Strip(ast.NodeTransformer):
    """Annotations, docstrings, ``if TYPE_CHECKING:`` blocks, ``cast()``, ``@overload`` stubs and
    ``from __future__`` imports removed: what is left is what runs."""

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in body:
            if _is_docstring(node) or (isinstance(node, ast.If) and _is_type_checking(node.test)):
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                    getattr(node.value.func, "id", None) in _TYPE_FACTORIES
                    or getattr(node.value.func, "attr", None) in _TYPE_FACTORIES):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    (isinstance(d, ast.Name) and d.id == "overload")
                    or (isinstance(d, ast.Attribute) and d.attr == "overload") for d in node.decorator_list):
                continue
            new = self.visit(node)
            if isinstance(new, ast.stmt):
                out.append(new)
        return out or [ast.Pass()]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._body(value))
        return super().generic_visit(node)

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=self.visit(node.value))

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name == "cast" and len(node.args) == 2:
            return self.visit(node.args[1])
        return self.generic_visit(node)


def _unused_imports_dropped(tree: ast.Module) -> ast.Module:
    """Imports of typing modules, and imports no name of the stripped module uses, dropped."""
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used
                     and module not in _TYPING_ONLY and a.name not in _TYPING_ONLY]
            if not names:
                continue
            node.names = names
        body.append(node)
    tree.body = body
    return tree


def behaviour_dump(source: str) -> str | None:
    """The module's AST without annotations, docstrings and comments (None when it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    stripped = _Strip().visit(tree)
    assert isinstance(stripped, ast.Module)
    stripped.body = _Strip()._body(stripped.body)
    return ast.dump(_unused_imports_dropped(stripped), include_attributes=False)


def same_behaviour(old: str, new: str) -> bool:
    """True when both versions parse and their ASTs are equal once annotations, docstrings and
    comments are stripped (a typing-only refactor: no behaviour to test)."""
    before, after = behaviour_dump(old), behaviour_dump(new)
    return before is not None and before == after


def sides_of_diff(diff: str) -> tuple[str, str] | None:
    """The old and the new text of one file from its diff with whole-file context (``git diff
    -U<large>``): None when the diff does not hold the whole file (a cut, or several hunks)."""
    old: list[str] = []
    new: list[str] = []
    hunks = 0
    for raw in diff.splitlines():
        if raw.startswith("@@"):
            hunks += 1
            continue
        if hunks == 0 or raw.startswith("\\"):
            continue
        if raw.startswith("[hopline: "):
            return None
        if raw.startswith("-"):
            old.append(raw[1:])
        elif raw.startswith("+"):
            new.append(raw[1:])
        else:
            old.append(raw[1:])
            new.append(raw[1:])
    if hunks != 1:
        return None
    return "\n".join(old) + "\n", "\n".join(new) + "\n"
