"""Client input checks shared by the daemon API and the gateway (SPEC D-10): pure, no I/O.

Every JSON request body is parsed by :func:`loads_bounded` and every decimal id a client sends
(transcript cursors, ``Last-Event-ID``) by :func:`parse_decimal_id`. Each refuses with
:class:`InputRefused`, whose ``kind`` and fields the HTTP layer turns into a 400 naming its hop:

- a body that is not UTF-8 JSON, or holds a lone UTF-16 surrogate (``"\\ud800"``: valid JSON
  syntax, but no UTF-8 string can carry it, so it would fail later in SQLite or the encoder);
- a body nested deeper than the budget's ``HOPLINE_JSON_MAX_DEPTH``;
- a decimal id with anything but ASCII digits (``"²"`` passes ``str.isdigit``), or one past
  :data:`MAX_DECIMAL_ID` (SQLite's INTEGER).
"""

from __future__ import annotations

from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY
from hopline.errors import InputRefused

# The largest id a client may send: SQLite INTEGER, the journal's event ids and cursors.
MAX_DECIMAL_ID = 2**63 - 1
_MAX_DECIMAL_DIGITS = len(str(MAX_DECIMAL_ID))
# orjson refuses documents nested deeper than this on its own (its message says "depth limit").
_ORJSON_MAX_DEPTH = 1024
_ASCII_DIGITS = frozenset("0123456789")


def nesting_depth(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0, ``[]`` is 1), counted without
    recursion; the walk stops at the first container deeper than ``limit`` and returns its depth."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if depth > limit:
                return depth
        stack.extend((child, depth) for child in children if isinstance(child, (dict, list)))
    return deepest


def loads_bounded(raw: bytes, max_depth: int) -> Any:
    """``raw`` parsed as JSON, or :class:`InputRefused` (``invalid_json`` or ``json_too_deep``)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise too_deep(_ORJSON_MAX_DEPTH + 1, max_depth) from None
        raise InputRefused("invalid_json", f"the body is not UTF-8 JSON: {exc}", field="(body)") from None
    depth = nesting_depth(value, max_depth)
    if depth > max_depth:
        raise too_deep(depth, max_depth)
    return value


def too_deep(observed: int, limit: int) -> InputRefused:
    setting = CEILINGS_BY_KEY["json_max_depth"].name
    return InputRefused("json_too_deep",
                        f"the body is nested at least {observed} levels deep, over the limit of {limit} "
                        f"({setting})", field="(body)",
                        **CEILINGS_BY_KEY["json_max_depth"].exceeded(limit, observed).limit_fields())


def parse_decimal_id(text: str, name: str) -> int:
    """A non-negative decimal id of ASCII digits, at most :data:`MAX_DECIMAL_ID`."""
    digits = text.strip()
    if (digits and len(digits) <= _MAX_DECIMAL_DIGITS and _ASCII_DIGITS.issuperset(digits)
            and int(digits) <= MAX_DECIMAL_ID):
        return int(digits)
    raise InputRefused(f"invalid_{name.lower().replace('-', '_')}",
                       f"{name} must be a decimal integer of ASCII digits from 0 to {MAX_DECIMAL_ID}",
                       field=name, limit=MAX_DECIMAL_ID)
