"""Manual, not in `make bench` (it needs the peers kit): hopline serve with a `qwen --acp` child side
by side with `qwen serve` 0.24.4, on the same prompts and the same fake model (SPEC D-8, D-9).

    source $PEERS_DIR/env.sh && bash $PEERS_DIR/peers.sh start-fake     # fake model, 127.0.0.1:18080
    hopline serve --port 18765 --agent-cmd "qwen --acp --approval-mode yolo" \
        --agent-env OPENAI_API_KEY,OPENAI_BASE_URL,OPENAI_MODEL,HOME &   # qwen needs its own provider env
    python bench/peers_qwen.py hopline http://127.0.0.1:18765 TOKEN DAEMON_PID "$PEERS/ws"
    python bench/peers_qwen.py qwen http://127.0.0.1:4170 - DAEMON_PID "$PEERS/ws"

DAEMON_PID is the daemon process whose RSS is sampled every 20 ms (its children are not counted).
Prints one JSON object: three session create times (hopline: each after the warm pool refilled),
the ``available_commands_update`` as the client receives it, a 20,000,000-character ``BIG_REPLY``
(its sha256 against the fake model's text), the largest SSE event, and the daemon's peak RSS.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any

import httpx
import psutil

from hopline.client import DaemonClient, Event
from hopline.client.daemon import to_event
from hopline.wire.sse import SseParser

REPLY_CHARS = 20_000_000
MiB = 1 << 20
TURN_ENDS = ("turn_complete", "turn_error", "prompt_cancelled")


def expected_sha256() -> str:
    sys.path.insert(0, os.environ["PEERS_DIR"])  # the kit's fake model makes the reply
    from fake_openai import big_text

    return hashlib.sha256(big_text(REPLY_CHARS).encode()).hexdigest()


class PeakRss:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self.stopped = False
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.stopped:
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)


def _qwen_update(event: Event) -> dict[str, Any]:
    update = (event.data.get("data") or {}).get("update")
    return update if isinstance(update, dict) else {}


async def qwen_side(url: str, workspace: str) -> dict[str, Any]:
    out: dict[str, Any] = {"creates": []}
    async with httpx.AsyncClient(timeout=600) as http:
        session_id = ""
        for _ in range(3):
            start = time.perf_counter()
            answer = await http.post(url + "/session", json={"cwd": workspace, "sessionScope": "thread",
                                                              "approvalMode": "yolo"})
            out["creates"].append(round(time.perf_counter() - start, 3))
            session_id = answer.json()["sessionId"]
        events: list[Event] = []
        parser = SseParser(64 * MiB)
        async with http.stream("GET", f"{url}/session/{session_id}/events") as response:
            prompt = asyncio.ensure_future(http.post(
                f"{url}/session/{session_id}/prompt",
                json={"prompt": [{"type": "text", "text": f"BIG_REPLY:{REPLY_CHARS}"}]}))
            async for chunk in response.aiter_bytes():
                events += [to_event(m) for m in parser.feed(chunk)]
                if events and events[-1].type in TURN_ENDS:
                    break
            await prompt
        text = "".join(_qwen_update(e).get("content", {}).get("text", "") for e in events
                       if _qwen_update(e).get("sessionUpdate") == "agent_message_chunk")
        out["availableCommandsEventBytes"] = [e.size for e in events if _qwen_update(e).get("sessionUpdate")
                                              == "available_commands_update"]
        out["maxEventBytes"] = max(e.size for e in events)
        out["turnEnd"] = events[-1].type
        out["replyChars"] = len(text)
        out["replySha256Matches"] = hashlib.sha256(text.encode()).hexdigest() == expected_sha256()
        status = (await http.get(url + "/daemon/status")).json()
        out["pipe"] = ((status.get("runtime") or {}).get("perf") or {}).get("pipe")
    return out


async def hopline_side(url: str, token: str, workspace: str) -> dict[str, Any]:
    out: dict[str, Any] = {"creates": []}
    async with DaemonClient(url, token) as client:
        session_id = ""
        for _ in range(3):
            for _ in range(1200):  # the pool's steady state: a warm child is ready
                if ((await client.status()).get("warmChildren") or {}).get("ready"):
                    break
                await asyncio.sleep(0.05)
            start = time.perf_counter()
            session_id = await client.create_session(cwd=workspace)
            out["creates"].append(round(time.perf_counter() - start, 3))
        prompt_id = await client.prompt(session_id, f"BIG_REPLY:{REPLY_CHARS}")
        events = [e async for e in client.turn_events(session_id, prompt_id, last_event_id=0)]
        commands = [e for e in events if e.update_kind == "available_commands_update"]
        out["availableCommandsEventBytes"] = [e.size for e in commands]
        if commands:
            original = await client.resolve_update(session_id, commands[-1].update)
            out["availableCommandsResolvedBytes"] = len(json.dumps(original, separators=(",", ":")).encode())
        parts = [(await client.resolve_update(session_id, e.update))["content"]["text"] for e in events
                 if e.update_kind == "agent_message_chunk" and e.prompt_id == prompt_id]
        text = "".join(parts)
        end = events[-1]
        out["maxEventBytes"] = max(e.size for e in events)
        out["turnEnd"] = [end.type, end.data.get("stopReason"), end.data.get("lostBytes"),
                          end.data.get("degraded")]
        out["replyChars"] = len(text)
        out["replySha256Matches"] = hashlib.sha256(text.encode()).hexdigest() == expected_sha256()
        status = await client.status()
        for key in ("sse", "delivery", "warmChildren"):
            out[key] = status[key]
        out["pipe"] = status["runtime"]["perf"]["pipe"]
    return out


def main() -> None:
    side, url, token, pid, workspace = sys.argv[1:6]
    rss = PeakRss(int(pid))
    start = time.perf_counter()
    out = asyncio.run(hopline_side(url, token, workspace) if side == "hopline" else qwen_side(url, workspace))
    rss.stopped = True
    out["seconds"] = round(time.perf_counter() - start, 1)
    out["daemonPeakRssMiB"] = round(rss.peak / MiB, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
