"""The naive relay baseline: what one writes without a budget in mind.

An asyncio TCP server on 127.0.0.1 answering ``GET /events`` with SSE: it spawns the ACP agent,
does ``initialize`` and ``session/new``, sends ``: ready``, sends ``session/prompt``, then for each
line it ``readline()``s (with the stream limit raised so big frames fit), ``json.loads`` it,
``json.dumps`` the notification's params and writes ``data: ...\\n\\n`` to the socket, until the
prompt's answer, then ``event: done`` and close.

    python bench/naive_relay.py PORT AGENT_ARGV...
"""

from __future__ import annotations

import asyncio
import json
import sys

READLINE_LIMIT = 256 * 1024 * 1024  # "raised limit": large enough for any frame of the benchmark


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, agent: list[str]) -> None:
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass  # request line and headers are ignored: there is one route
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                 b"connection: close\r\n\r\n")
    child = await asyncio.create_subprocess_exec(*agent, stdin=asyncio.subprocess.PIPE,
                                                 stdout=asyncio.subprocess.PIPE, limit=READLINE_LIMIT)
    assert child.stdin is not None and child.stdout is not None
    next_id = 0

    async def request(method: str, params: dict) -> int:
        nonlocal next_id
        next_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params})
        child.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
        await child.stdin.drain()  # type: ignore[union-attr]
        return next_id

    async def answer(msg_id: int) -> dict:
        while True:
            message = json.loads(await child.stdout.readline())  # type: ignore[union-attr]
            if message.get("id") == msg_id and "method" not in message:
                return message

    try:
        await answer(await request("initialize", {"protocolVersion": 1, "clientCapabilities": {}}))
        new = await answer(await request("session/new", {"cwd": "/", "mcpServers": []}))
        session_id = new["result"]["sessionId"]
        writer.write(b": ready\n\n")
        await writer.drain()
        prompt_id = await request("session/prompt", {"sessionId": session_id,
                                                     "prompt": [{"type": "text", "text": "go"}]})
        while True:
            line = await child.stdout.readline()
            if not line:
                break
            message = json.loads(line)
            if message.get("method") == "session/update":
                writer.write(b"data: " + json.dumps(message["params"]).encode() + b"\n\n")
                await writer.drain()
            elif message.get("id") == prompt_id:
                writer.write(b"event: done\ndata: {}\n\n")
                await writer.drain()
                break
    finally:
        child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 5)
        except TimeoutError:
            child.kill()
        writer.close()


async def serve(port: int, agent: list[str]) -> None:
    server = await asyncio.start_server(lambda r, w: relay(r, w, agent), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2:]))
