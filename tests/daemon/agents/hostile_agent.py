"""A hostile ACP child for issue #26's probes: plain NDJSON JSON-RPC on stdio (no SDK, so it can
misbehave), one thread reading stdin and one per prompt. A prompt's text is a command:

  ``stopread``            ends its turn, then never reads stdin again (the process stays alive)
  ``perms N SIZE``        sends N ``session/request_permission`` requests whose tool call carries
                          SIZE bytes of text, from another thread while stdin is still read; once
                          every one was answered, says ``perms: <outcome or error code>=<count> ...``
                          (a limit error's code followed by ``/<setting>/<unit>``) and ends the turn
  ``asks N``              sends N requests of a method the daemon does not serve (``fs/write_text_file``),
                          then says how they were answered
  ``grandchild DIR``      forks a grandchild that calls ``setsid()`` and one more (forked by a
                          process that then exits) that does too; both write their pid to DIR and sleep
  ``flood N``             sends N tiny ``agent_message_chunk`` updates as fast as it can, then ends
  ``malformed``           sends updates of every kind in shapes the schema does not allow
                          (:data:`MALFORMED`) and a permission request of one, then ``malformed done``
  ``closeout``            closes its stdout and keeps running, deaf to SIGTERM (never answers)
  ``silent``              never answers the prompt and writes nothing more (stdin is still read, a
                          cancel ignored)
  ``permwait``            asks one permission, then writes nothing until it is answered; then says
                          ``permwait: <outcome>=1`` and ends the turn
  anything else           echoed back as one chunk (``echo: TEXT``)

``HOSTILE_EXTENSION_NOTICE=1`` makes it send an extension notification that names no session
(``_auth/status_update``, as claude-agent-acp does) right after it answers ``initialize``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

_write_lock = threading.Lock()
_out = sys.stdout.buffer
_ids = iter(range(1, 2**62))
_answers: dict[int, dict[str, Any]] = {}
_answered = threading.Condition()


def send(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    with _write_lock:
        _out.write(line)
        _out.flush()


def say(session_id: str, text: str) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": session_id,
        "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})


def request(method: str, params: dict[str, Any]) -> int:
    request_id = next(_ids)
    send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
    return request_id


def wait_answers(ids: list[int]) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    with _answered:
        for request_id in ids:
            while request_id not in _answers:
                _answered.wait()
            answer = _answers.pop(request_id)
            if "error" in answer:
                data = answer["error"].get("data")
                limited = isinstance(data, dict) and "limit" in data
                shape = f"/{data['setting']}/{data['unit']}" if limited else ""
                outcomes[f"error{answer['error'].get('code')}{shape}"] += 1
            else:
                outcome = (answer.get("result") or {}).get("outcome") or {}
                outcomes[str(outcome.get("optionId") or outcome.get("outcome"))] += 1
    return outcomes


def permissions(session_id: str, count: int, size: int) -> str:
    text = "t" * size
    ids = [request("session/request_permission", {
        "sessionId": session_id,
        "toolCall": {"toolCallId": f"call-{i}", "title": f"step {i}", "kind": "execute", "status": "pending",
                     "content": [{"type": "content", "content": {"type": "text", "text": text}}]},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "deny", "name": "Deny", "kind": "reject_once"}]}) for i in range(count)]
    outcomes = wait_answers(ids)
    return "perms: " + " ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))


def asks(session_id: str, count: int) -> str:
    ids = [request("fs/write_text_file", {"sessionId": session_id, "path": "/tmp/never", "content": "x"})
           for _ in range(count)]
    outcomes = wait_answers(ids)
    return "asks: " + " ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))


def _sleeper(directory: str, name: str) -> None:
    os.setsid()
    with open(os.path.join(directory, name), "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(600)
    os._exit(0)


def grandchildren(directory: str) -> str:
    if os.fork() == 0:  # a grandchild that leaves the agent's process group and session
        _sleeper(directory, "setsid.pid")
    if os.fork() == 0:  # one whose parent exits: an orphan
        if os.fork() == 0:
            _sleeper(directory, "orphan.pid")
        os._exit(0)
    while not all(os.path.exists(os.path.join(directory, n)) for n in ("setsid.pid", "orphan.pid")):
        time.sleep(0.01)
    return "grandchildren started"


MARKUP = "<img src=x data-injected=1>"
# Every update kind, each in shapes a renderer does not expect (ACP's schema allows none of them).
MALFORMED: list[dict[str, Any]] = [
    {"sessionUpdate": "agent_message_chunk", "content": 42},
    {"sessionUpdate": "agent_message_chunk", "content": [MARKUP]},
    {"sessionUpdate": "agent_thought_chunk", "content": None},
    {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": {"nested": MARKUP}}},
    {"sessionUpdate": "tool_call", "toolCallId": {"id": 1}, "title": ["t"], "status": 7, "content": MARKUP},
    {"sessionUpdate": "tool_call_update", "toolCallId": "call-m", "content": [None, 5, {"type": "content"}],
     "_meta": {"hopline.sidecar": "not a list"}},
    {"sessionUpdate": "tool_call_update", "toolCallId": "call-m", "content": {"type": "content"},
     "_meta": {"hopline.dropped": {"bytes": "many", "limit": None}}},
    {"sessionUpdate": "plan", "entries": "not a list"},
    {"sessionUpdate": "plan", "entries": [None, 3, {"content": {"x": 1}, "status": [], "priority": {}}]},
    {"sessionUpdate": "available_commands_update", "availableCommands": "not a list"},
    {"sessionUpdate": "available_commands_update", "availableCommands": [None, {"name": {"n": 1}}]},
    {"sessionUpdate": "current_mode_update", "currentModeId": {"mode": MARKUP}},
    {"sessionUpdate": {"kind": "object"}, "content": "x"},
    {"sessionUpdate": MARKUP},
]


def malformed(session_id: str) -> None:
    for update in MALFORMED:
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id,
                                                                         "update": update}})
    request("session/request_permission", {"sessionId": session_id, "toolCall": MARKUP, "options": [1, None]})
    say(session_id, "malformed done")


def run_prompt(request_id: Any, session_id: str, text: str) -> None:
    words = text.split()
    command = words[0] if words else ""
    if command == "perms":
        say(session_id, permissions(session_id, int(words[1]), int(words[2])))
    elif command == "asks":
        say(session_id, asks(session_id, int(words[1])))
    elif command == "grandchild":
        say(session_id, grandchildren(words[1]))
    elif command == "malformed":
        malformed(session_id)
    elif command == "permwait":
        say(session_id, permissions(session_id, 1, 16).replace("perms", "permwait", 1))
    elif command == "flood":
        for i in range(int(words[1])):
            say(session_id, f"f{i}")
    elif command != "stopread":
        say(session_id, f"echo: {text}")
    send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})


def main() -> None:
    stdin = sys.stdin.buffer
    for line in stdin:
        message = json.loads(line)
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method is None and request_id is not None:  # an answer to one of our requests
            with _answered:
                _answers[request_id] = message
                _answered.notify_all()
        elif method == "initialize":
            send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": 1, "agentCapabilities": {"loadSession": False}}})
            if os.environ.get("HOSTILE_EXTENSION_NOTICE") == "1":
                send({"jsonrpc": "2.0", "method": "_auth/status_update", "params": {"status": "ok"}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": f"h-{uuid.uuid4().hex}"}})
        elif method == "session/prompt":
            text = "".join(b.get("text", "") for b in params.get("prompt") or [] if isinstance(b, dict))
            if text.strip() == "stopread":
                run_prompt(request_id, params["sessionId"], "stopread")
                while True:  # alive, and never reads stdin again
                    time.sleep(3600)
            if text.strip() == "closeout":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                os.close(1)
                while True:  # alive, its stdout closed
                    time.sleep(3600)
            if text.strip() == "silent":
                continue  # never answered; stdin still read
            threading.Thread(target=run_prompt, args=(request_id, params["sessionId"], text.strip()),
                             daemon=True).start()
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "no"}})


if __name__ == "__main__":
    main()
