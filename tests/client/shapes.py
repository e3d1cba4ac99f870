"""Holding a JSON answer to the SDK's TypedDict of it: every key it requires, no key it does not
declare, and each value of its declared type (pydantic, strict), nested answers included."""

from __future__ import annotations

from typing import Any, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter
from typing_extensions import is_typeddict  # the SDK's TypedDicts are typing_extensions'


def _nested(hint: Any) -> list[Any]:
    """The TypedDicts a field's type holds: itself, or inside a list or an optional."""
    if is_typeddict(hint):
        return [hint]
    return [t for arg in get_args(hint) for t in _nested(arg)] if get_origin(hint) is not None else []


def assert_shape(value: Any, answer: Any, where: str = "answer") -> None:
    TypeAdapter(answer).validate_python(value, strict=True)
    assert isinstance(value, dict), f"{where}: {type(value).__name__}, not an object"
    required, optional = set(answer.__required_keys__), set(answer.__optional_keys__)
    assert required <= set(value), f"{where}: missing {sorted(required - set(value))}"
    undeclared = set(value) - required - optional
    assert not undeclared, f"{where}: undeclared {sorted(undeclared)}"
    for key, hint in get_type_hints(answer).items():
        for inner in _nested(hint):
            field = value.get(key)
            for index, item in enumerate(field if isinstance(field, list) else [field]):
                if isinstance(item, dict):
                    assert_shape(item, inner, f"{where}.{key}[{index}]")
