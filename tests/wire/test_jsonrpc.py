"""JSON-RPC message kinds from shape alone."""

from __future__ import annotations

import pytest

from hopline.wire.jsonrpc import is_response, message_kind, method_of


@pytest.mark.parametrize(
    ("msg", "kind"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {}}, "request"),
        ({"jsonrpc": "2.0", "id": None, "method": "x"}, "request"),
        ({"jsonrpc": "2.0", "method": "session/update", "params": {}}, "notification"),
        ({"jsonrpc": "2.0", "id": 1, "result": None}, "response"),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "m"}}, "error_response"),
        ({"jsonrpc": "2.0", "id": 1}, "invalid"),
        ({"jsonrpc": "2.0", "method": 5}, "invalid"),
        ({"result": 1}, "invalid"),
        ([1, 2], "invalid"),
        ("text", "invalid"),
        (None, "invalid"),
    ],
)
def test_message_kind(msg: object, kind: str) -> None:
    assert message_kind(msg) == kind


def test_method_of() -> None:
    assert method_of({"method": "session/update"}) == "session/update"
    assert method_of({"method": 3}) is None
    assert method_of({"id": 1, "result": {}}) is None
    assert method_of([]) is None
    assert is_response({"id": 1, "error": {}}) and not is_response({"method": "m"})
