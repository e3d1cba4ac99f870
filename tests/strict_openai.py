"""A strict OpenAI-compatible chat-completions server, for the tests and the benchmarks.

Like the real APIs it answers any field outside the chat-completions schema with a 400 (top-level
request fields, message fields per role, tool-call and tool-schema fields, ``stream_options``), in
their error shape. It streams like them: ``text/event-stream`` with one ``data: {chunk}`` event per
delta (the role first, text in word pieces, tool calls opened by ``index`` with id and name, then
their arguments in pieces interleaved across the calls), a ``finish_reason`` chunk, a ``usage``
chunk when ``stream_options.include_usage`` is set, and ``data: [DONE]``.

What it answers comes from hopline's scripted model (the messages and tools are all it sees: no
hint of ours reaches it), so a whole gate session can run through it; a summarization request is
recognized by hopline's summarizer system prompt, as a real model would simply follow it.
``usage.prompt_tokens`` counts the request's messages and tools JSON at ``bytes_per_token``.

Knobs for failure tests: ``fail_with`` answers every request with that status (its error shape);
``refuse_summaries`` answers every summarization request with a 400 (as a
provider does that will not take it); ``cut_after`` deltas then the stream stops without finishing
(``"close"``: the body ends cleanly; ``"drop"``: the connection closes mid-body; ``"reset"``: it is reset);
``drop_after_finish`` closes it mid-body right after the ``finish_reason`` chunk (no usage, no
``[DONE]``); ``hold_after`` deltas then the server waits for the client to go away (``holding`` is
set) and records it in ``disconnected``; ``delta_delay`` and ``first_delta_delay`` pace the stream
(benchmarks). ``text_delta_at`` holds, per streamed answer,
the ``time.perf_counter()`` right after each of its text deltas was written (flushed).

stdlib only (``http.server``); binds 127.0.0.1 on a free port; ``stop()`` ends it.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from hopline.gateway.providers import text_pieces
from hopline.harness.model import LlmTurnRequest
from hopline.harness.summarize import SUMMARY_SYSTEM_PROMPT
from hopline.scripted.model import ScriptedModel

# The request schema of POST /v1/chat/completions.
REQUEST_FIELDS = frozenset({
    "model", "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "reasoning_effort",
    "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
    "verbosity", "web_search_options",
})
MESSAGE_FIELDS = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
TOOL_CALL_FIELDS = frozenset({"id", "type", "function"})
FUNCTION_CALL_FIELDS = frozenset({"name", "arguments"})
TOOL_FIELDS = frozenset({"type", "function"})
TOOL_FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})
STREAM_OPTIONS_FIELDS = frozenset({"include_usage", "include_obfuscation"})


class Invalid(Exception):
    def __init__(self, message: str, param: str | None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _extra(obj: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unexpected = sorted(set(obj) - allowed)
    if unexpected:
        raise Invalid(f"Additional properties are not allowed ({unexpected[0]!r} was unexpected) - {where!r}",
                      where)


def _function_holder(obj: Any, fields: frozenset[str], function_fields: frozenset[str], where: str) -> None:
    """A tool call or a tool schema: an object with a ``function`` object, both with known fields."""
    if not isinstance(obj, dict) or not isinstance(obj.get("function"), dict):
        raise Invalid(f"Invalid type for '{where}'", where)
    _extra(obj, fields, where)
    _extra(obj["function"], function_fields, f"{where}.function")


def validate(body: Any) -> None:
    """Raise :class:`Invalid` for anything the chat-completions schema does not hold."""
    if not isinstance(body, dict):
        raise Invalid("We could not parse the JSON body of your request.", None)
    for key in body:
        if key not in REQUEST_FIELDS:
            raise Invalid(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    if not isinstance(body.get("model"), str):
        raise Invalid("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Invalid("'messages' must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in MESSAGE_FIELDS:
            raise Invalid(f"Invalid value for 'role' - {where!r}", f"{where}.role")
        _extra(message, MESSAGE_FIELDS[message["role"]], where)
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise Invalid(f"Invalid type for '{where}.content'", f"{where}.content")
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise Invalid(f"Missing required parameter: '{where}.tool_call_id'", f"{where}.tool_call_id")
        for j, call in enumerate(message.get("tool_calls") or []):
            call_where = f"{where}.tool_calls.{j}"
            _function_holder(call, TOOL_CALL_FIELDS, FUNCTION_CALL_FIELDS, call_where)
            if not isinstance(call["function"].get("arguments"), str):
                raise Invalid(f"Invalid type for '{call_where}.function.arguments'", call_where)
    for i, tool in enumerate(body.get("tools") or []):
        _function_holder(tool, TOOL_FIELDS, TOOL_FUNCTION_FIELDS, f"tools.{i}")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise Invalid("Invalid type for 'stream'", "stream")
    options = body.get("stream_options")
    if options is not None:
        if not body.get("stream"):
            raise Invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          "stream_options")
        if not isinstance(options, dict):
            raise Invalid("Invalid type for 'stream_options'", "stream_options")
        _extra(options, STREAM_OPTIONS_FIELDS, "stream_options")


@dataclasses.dataclass
class Reply:
    content: str
    tool_calls: list[dict[str, Any]]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class StrictOpenAI:
    """See the module docstring. ``with StrictOpenAI(...) as server:`` starts and stops it."""

    def __init__(self, model: ScriptedModel | None = None, *, bytes_per_token: int = 4,
                 arg_piece_chars: int = 24) -> None:
        self.model = model or ScriptedModel()
        self.bytes_per_token = bytes_per_token
        self.arg_piece_chars = arg_piece_chars
        self.reply: Reply | None = None  # a fixed answer instead of the scripted model's
        self.refuse_summaries = False
        self.fail_with: int | None = None  # answer every request with this status (a 401, a 429)
        self.cut_after: int | None = None
        self.cut_mode = "close"
        self.drop_after_finish = False  # close the connection mid-body right after the finish chunk
        self.hold_after: int | None = None
        self.hold_seconds = 30.0  # how long a held stream waits for the client to leave
        self.delta_delay = 0.0
        self.first_delta_delay = 0.0
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # of each accepted request, names lower-cased
        self.rejections: list[dict[str, Any]] = []
        self.summaries = 0
        self.text_delta_at: list[list[float]] = []
        self.disconnected = threading.Event()
        self.holding = threading.Event()  # a held stream is waiting for its client to leave
        self._lock = threading.Lock()
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # serve_forever checks for shutdown() every poll_interval (0.5 s by default): every test stop
        # waited that long.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01},
                                        name="strict-openai", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> StrictOpenAI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def __enter__(self) -> StrictOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- answers ------------------------------------------------------------------------------

    @staticmethod
    def is_summary(body: dict[str, Any]) -> bool:
        first = body["messages"][0]
        return bool(first.get("role") == "system" and first.get("content") == SUMMARY_SYSTEM_PROMPT)

    def answer(self, body: dict[str, Any]) -> Reply:
        if self.reply is not None:
            return self.reply
        messages = body["messages"]
        summary = self.is_summary(body)
        if summary:
            with self._lock:
                self.summaries += 1
        request = LlmTurnRequest(messages, tools=body.get("tools") or [],
                                 purpose="summary" if summary else "turn")
        message = self.model.respond(request).message
        return Reply(str(message.get("content") or ""), list(message.get("tool_calls") or []))

    def usage(self, body: dict[str, Any], reply: Reply) -> dict[str, int]:
        prompt = len(orjson.dumps({"messages": body["messages"], "tools": body.get("tools") or []}))
        completion = len(reply.content.encode()) + len(orjson.dumps(reply.tool_calls))
        prompt_tokens = _ceil_div(prompt, self.bytes_per_token)
        completion_tokens = _ceil_div(completion, self.bytes_per_token)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def deltas(self, reply: Reply) -> list[dict[str, Any]]:
        """The delta objects of a streamed answer, in order (role, text, calls, argument pieces)."""
        out: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        out.extend({"content": piece} for piece in text_pieces(reply.content))
        pieces: list[list[str]] = []
        for index, call in enumerate(reply.tool_calls):
            out.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"], "arguments": ""}}]})
            args = call["function"]["arguments"]
            size = self.arg_piece_chars
            pieces.append([args[i:i + size] for i in range(0, len(args), size)])
        for step in range(max((len(p) for p in pieces), default=0)):
            for index, call_pieces in enumerate(pieces):  # interleaved across the calls
                if step < len(call_pieces):
                    piece = {"index": index, "function": {"arguments": call_pieces[step]}}
                    out.append({"tool_calls": [piece]})
        return out


class _Handler(BaseHTTPRequestHandler):
    server_owner: StrictOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _json(self, status: int, obj: Any) -> None:
        data = orjson.dumps(obj)
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        owner = self.server_owner
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        try:
            body = orjson.loads(raw)
            validate(body)
        except (orjson.JSONDecodeError, Invalid) as exc:
            invalid = exc if isinstance(exc, Invalid) else Invalid("We could not parse the JSON body.", None)
            owner.rejections.append({"status": 400, "param": invalid.param, "message": invalid.message})
            self._json(400, {"error": {"message": invalid.message, "type": "invalid_request_error",
                                       "param": invalid.param, "code": invalid.code}})
            return
        if owner.fail_with is not None:
            owner.rejections.append({"status": owner.fail_with, "param": None, "message": "fail_with"})
            self._json(owner.fail_with, {"error": {"message": f"refused with {owner.fail_with}",
                                                   "type": "test_error", "param": None, "code": None}})
            return
        if owner.refuse_summaries and owner.is_summary(body):
            owner.rejections.append({"status": 400, "param": "messages", "message": "summary refused"})
            self._json(400, {"error": {"message": "This request is refused.", "type": "invalid_request_error",
                                       "param": "messages", "code": None}})
            return
        owner.requests.append(body)
        owner.headers.append({k.lower(): v for k, v in self.headers.items()})
        reply = owner.answer(body)
        if body.get("stream"):
            self._stream(body, reply)
            return
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        self._json(200, {"id": "chatcmpl-strict", "object": "chat.completion", "created": int(time.time()),
                         "model": body["model"],
                         "choices": [{"index": 0, "message": message,
                                      "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
                         "usage": owner.usage(body, reply)})

    # --- streaming ------------------------------------------------------------------------------

    def _event(self, data: bytes) -> None:
        payload = b"data: " + data + b"\n\n"
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

    def _chunk(self, body: dict[str, Any], **fields: Any) -> bytes:
        return orjson.dumps({"id": "chatcmpl-strict", "object": "chat.completion.chunk",
                             "created": int(time.time()), "model": body["model"], **fields})

    def _client_gone(self, timeout: float) -> bool:
        readable, _, _ = select.select([self.connection], [], [], timeout)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _cut(self, mode: str) -> None:
        """End the stream unfinished: ``close`` ends the body cleanly, ``drop`` closes the connection
        mid-body (FIN), ``reset`` drops it (RST)."""
        self.close_connection = True
        if mode == "drop":
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
        elif mode == "reset":
            linger_zero = struct.pack("ii", 1, 0)  # close with an RST, as a dropped connection does
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_zero)
            self.connection.close()
        else:
            self.wfile.write(b"0\r\n\r\n")

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        owner = self.server_owner
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        sent = 0
        written: list[float] = []
        owner.text_delta_at.append(written)
        try:
            for delta in owner.deltas(reply):
                counted = "role" not in delta
                if counted and owner.cut_after is not None and sent >= owner.cut_after:
                    self._cut(owner.cut_mode)
                    return
                if counted and owner.hold_after is not None and sent >= owner.hold_after:
                    self.close_connection = True
                    owner.holding.set()
                    deadline = time.monotonic() + owner.hold_seconds
                    while time.monotonic() < deadline:
                        if self._client_gone(0.05):
                            owner.disconnected.set()
                            return
                    return
                if counted:
                    time.sleep(owner.first_delta_delay if sent == 0 else owner.delta_delay)
                self._event(self._chunk(body, choices=[{"index": 0, "delta": delta, "finish_reason": None}]))
                if counted:
                    sent += 1
                    if "content" in delta:
                        written.append(time.perf_counter())
            finish = "tool_calls" if reply.tool_calls else "stop"
            self._event(self._chunk(body, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
            if owner.drop_after_finish:
                self._cut("drop")
                return
            if (body.get("stream_options") or {}).get("include_usage"):
                self._event(self._chunk(body, choices=[], usage=owner.usage(body, reply)))
            self._event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            owner.disconnected.set()
            self.close_connection = True
