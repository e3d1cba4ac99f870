"""The uvicorn internals hopline's server stands on (hopline.http.server), checked by name: the
vectored body write changes each request cycle's class where uvicorn starts it (its private
``_start_asgi_task``), and writes a chunk with the cycle's own state; the head limits override its
parser callbacks. pyproject pins uvicorn to the versions this passed on; a failure names the version
that changed them: re-measure the vectored write there (bench/README.md), then widen the pin."""

from __future__ import annotations

import inspect
import re

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from hopline.budget import Budget
from hopline.http.server import guarded_protocol, vectored_cycle

VERSION = f"uvicorn {uvicorn.__version__}"


def _source(function: object) -> str:
    return inspect.getsource(function)  # type: ignore[arg-type]


def test_every_request_cycle_starts_in_start_asgi_task() -> None:
    start = getattr(HttpToolsProtocol, "_start_asgi_task", None)
    assert start is not None, f"{VERSION} has no HttpToolsProtocol._start_asgi_task"
    assert list(inspect.signature(start).parameters) == ["self", "cycle", "app"], (
        f"{VERSION} changed _start_asgi_task's parameters")
    assert "self._start_asgi_task(self.cycle, app)" in _source(HttpToolsProtocol.on_headers_complete), (
        f"{VERSION} starts a request's cycle elsewhere than _start_asgi_task")
    assert "self._start_asgi_task(cycle, app)" in _source(HttpToolsProtocol.on_response_complete), (
        f"{VERSION} starts a pipelined request's cycle elsewhere than _start_asgi_task")


def test_a_cycles_class_can_change_and_its_send_sees_the_state_the_vectored_write_reads() -> None:
    assert "__slots__" not in vars(RequestResponseCycle), f"{VERSION}: a cycle's class cannot change"
    assert inspect.iscoroutinefunction(RequestResponseCycle.send), f"{VERSION}: its send is no coroutine"
    init = _source(RequestResponseCycle.__init__)
    for attribute in ("scope", "transport", "flow", "disconnected", "response_complete", "chunked_encoding"):
        assert re.search(rf"self\.{attribute}\b[^=\n]*=", init), f"{VERSION}: a cycle has no {attribute}"
    send = _source(RequestResponseCycle.send)
    assert "self.flow.drain()" in send and "self.chunked_encoding" in send, (
        f"{VERSION} writes a chunked body otherwise than hopline's vectored write mirrors")
    assert issubclass(vectored_cycle(RequestResponseCycle), RequestResponseCycle)


def test_the_parser_callbacks_the_head_limits_override_are_uvicorns() -> None:
    for name in ("connection_made", "connection_lost", "data_received", "on_message_begin", "on_header",
                 "on_headers_complete", "on_body", "on_message_complete"):
        assert callable(getattr(HttpToolsProtocol, name, None)), f"{VERSION} has no HttpToolsProtocol.{name}"
    for attribute in ("self.connections", "self.cycle ="):
        assert attribute in _source(HttpToolsProtocol), f"{VERSION}: HttpToolsProtocol has no {attribute}"
    assert guarded_protocol(Budget.defaults(), "daemon.api") is not None
