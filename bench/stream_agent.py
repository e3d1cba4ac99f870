"""A minimal raw ACP agent for the benchmarks (NDJSON JSON-RPC 2.0 on stdio, no SDK).

It answers ``initialize``, ``session/new``, ``session/load`` and ``session/prompt``; for each prompt
it copies a pre-generated NDJSON file of ``session/update`` notifications (made by
``bench.frames``, all for the session id it returned) to stdout, then answers the prompt with
``stopReason: end_turn``. Copying a file keeps the agent's own cost at that of ``cat``, so the
benchmark measures the relay, not the agent.

    python bench/stream_agent.py STREAM_FILE [SESSION_ID]

A prompt whose text is ``stream PATH`` streams ``PATH`` instead of ``STREAM_FILE``.
A prompt ``echo TEXT`` answers one ``agent_message_chunk`` of ``TEXT`` (the memory benchmark).
A prompt ``paced COUNT MS`` emits, after half a second (every reader subscribed), ``COUNT``
``agent_message_chunk`` frames ``MS`` apart, each text ``t=<wall time ns>`` (the delivery-lag
benchmark, ``bench/delivery_lag.py``).
``STREAM_AGENT_START_DELAY`` (seconds) delays the start, like an agent that loads a lot first
(the warm-pool benchmark).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from frames import message_chunk  # this script's folder (bench/) is first on sys.path

PROTOCOL_VERSION = 1
CHUNK = 1 << 20


def _paced(send: Callable[[dict], None], session_id: str, count: str, pace_ms: str) -> None:
    time.sleep(0.5)
    for _ in range(int(count)):
        send(message_chunk(f"t={time.time_ns()}", session_id))
        time.sleep(float(pace_ms) / 1000)


def main() -> int:
    time.sleep(float(os.environ.get("STREAM_AGENT_START_DELAY", "0")))
    stream_file = sys.argv[1]
    session_id = sys.argv[2] if len(sys.argv) > 2 else "bench-session-0001"
    out = sys.stdout.buffer

    def send(message: dict) -> None:
        out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        out.flush()

    for raw in sys.stdin.buffer:
        if not raw.strip():
            continue
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        method = message.get("method")
        msg_id = message.get("id")
        if msg_id is None:
            continue  # notifications (session/cancel) and responses to our (absent) requests
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": msg_id, "result": {
                "protocolVersion": PROTOCOL_VERSION,
                "agentCapabilities": {"loadSession": False,
                                      "promptCapabilities": {"image": False, "audio": False,
                                                             "embeddedContext": False}},
                "authMethods": []}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": msg_id, "result": {"sessionId": session_id}})
        elif method == "session/prompt":
            # A prompt "stream PATH" names another pre-generated file (one daemon, many streams).
            blocks = (message.get("params") or {}).get("prompt") or [{}]
            text = blocks[0].get("text", "") if isinstance(blocks[0], dict) else ""
            if text.startswith("echo "):  # one chunk saying the text back (the memory benchmark)
                send(message_chunk(text[len("echo "):], session_id))
                send({"jsonrpc": "2.0", "id": msg_id, "result": {"stopReason": "end_turn"}})
                continue
            if text.startswith("paced "):
                _paced(send, session_id, *text.split()[1:3])
                send({"jsonrpc": "2.0", "id": msg_id, "result": {"stopReason": "end_turn"}})
                continue
            path = text[len("stream "):] if text.startswith("stream ") else stream_file
            with open(path, "rb") as source:
                while True:
                    block = source.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
            out.flush()
            send({"jsonrpc": "2.0", "id": msg_id, "result": {"stopReason": "end_turn"}})
        elif "id" in message and method is not None:
            send({"jsonrpc": "2.0", "id": msg_id,
                  "error": {"code": -32601, "message": "method not found"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
