"""The relay's per-frame work: a text chunk is passed through as the agent's bytes (the same JSON
as encoding it), and the events queued for a subscriber go out in one socket write."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopline.budget import Budget
from hopline.compiled import ENV as COMPILED_ENV
from hopline.compiled import STATE as COMPILED_STATE
from hopline.daemon.bus import EventBus
from hopline.daemon.routes.sse import SseStream
from hopline.store.sqlite_journal import SqliteJournal
from hopline.wire.passthrough import PASSTHROUGH_MIN_FRAME_BYTES

from .support import running_daemon
from .test_serve import new_session, prompt


@pytest.mark.e2e
@pytest.mark.parametrize("compiled", ["1", "0"])  # the compiled hot path (when built) and the source
async def test_text_chunks_reach_sse_and_the_journal_as_the_agents_bytes(tmp_path: Path,
                                                                         compiled: str) -> None:
    # Chunks over the pass-through size and under it, under a sidecar threshold that keeps them
    # whole (over the threshold the projection moves their text: they are not unchanged).
    size = PASSTHROUGH_MIN_FRAME_BYTES
    env = {"HOPLINE_SIDECAR_THRESHOLD_BYTES": "1mb", COMPILED_ENV: compiled}
    with running_daemon(tmp_path, env=env) as daemon:
        async with daemon.client() as client:
            sid = await new_session(client, tmp_path)
            before = (await client.get("/daemon/status")).json()["delivery"]["passedThroughUpdates"]
            raw = b""
            async with client.stream("GET", f"/session/{sid}/events") as response:
                await prompt(client, sid, f"chunks 10 {size}")  # the frame: its text and the JSON-RPC
                await prompt(client, sid, f"chunks 10 {size - 1000}")
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if raw.count(b"event: turn_complete") == 2 and raw.endswith(b"\n\n"):
                        break
            status = (await client.get("/daemon/status")).json()
            assert status["compiled"]["state"] == ("off" if compiled == "0" else COMPILED_STATE.state)
            transcript = b""
            cursor: str | None = "0"
            while cursor is not None:
                page = (await client.get(f"/session/{sid}/transcript", params={"cursor": cursor})).content
                transcript += page
                cursor = orjson.loads(page)["nextCursor"]
    datas = [block.split(b"\ndata: ", 1)[1] for block in raw.split(b"\n\n")
             if b"event: session_update" in block]
    chunks = [d for d in datas if orjson.loads(d)["update"]["sessionUpdate"] == "agent_message_chunk"]
    assert len(chunks) >= 20
    # the spliced bytes are exactly what encoding the decoded event gives (the SDK agent writes
    # compact JSON): the same JSON as before, byte for byte
    assert all(d == orjson.dumps(orjson.loads(d)) for d in chunks)
    assert [orjson.loads(d)["update"]["content"]["text"].split()[1] for d in chunks[-20:]] == \
        [str(i) for i in range(10)] * 2
    # the ten over the size passed through, the ten under it encoded
    assert status["delivery"]["passedThroughUpdates"] - before == 10
    # the journal holds the same bytes (the transcript splices them in as stored)
    assert all(d in transcript for d in chunks)


async def _pump(stream: SseStream) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    task = asyncio.ensure_future(stream._pump(send))
    while not any(b"event: e\n" in m.get("body", b"") for m in sent):
        await asyncio.sleep(0.01)
    stream.subscriber.close()
    await asyncio.wait_for(task, 10)
    return [m for m in sent if m["type"] == "http.response.body" and b"replay_complete" not in m["body"]]


async def test_queued_events_go_out_in_one_write_split_exactly_at_the_bound(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    bus = EventBus(Budget.defaults(), journal)
    try:
        for bound_extra, writes in ((0, 1), (-1, 2)):
            subscriber, upto = await bus.subscribe("s1", 64)
            events = [bus.publish("s1", "e", {"i": i}) for i in range(10)]
            await bus.flushed()
            total = sum(e.size for e in events if e is not None)
            stream = SseStream(bus, "s1", subscriber, after=upto, upto=upto, resync=None, heartbeat=0.05,
                               write_max_bytes=total + bound_extra)
            bodies = await _pump(stream)
            # all ten at the bound in one write; one byte under it, two writes
            assert len(bodies) == writes
            assert b"".join(m["body"] for m in bodies) == b"".join(e.wire for e in events if e is not None)
            bus.unsubscribe(subscriber)
    finally:
        await journal.close()


def test_frames_pass_through_from_their_threshold_on() -> None:
    from hopline.daemon.sessions.relay import passthrough_bytes as _passthrough
    from hopline.wire.ndjson import NdjsonDecoder

    def frame_of(size: int) -> object:
        head = orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": ""}}}})
        text = "t" * (size - len(head))
        line = head.replace(b'"text":""', b'"text":"' + text.encode() + b'"') + b"\n"
        (frame,) = NdjsonDecoder(1 << 30).feed(line)
        assert frame.size == size  # type: ignore[attr-defined]
        return frame

    assert _passthrough(frame_of(PASSTHROUGH_MIN_FRAME_BYTES)) is not None  # type: ignore[arg-type]
    assert _passthrough(frame_of(PASSTHROUGH_MIN_FRAME_BYTES - 1)) is None  # type: ignore[arg-type]


async def test_an_event_over_the_write_bound_is_written_as_its_own_bytes(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    bus = EventBus(Budget.defaults(), journal)
    try:
        for bound_extra, own_writes in ((0, 0), (-1, 2)):
            subscriber, upto = await bus.subscribe("s1", 64)
            events = [bus.publish("s1", "e", data) for data in ({"i": 0}, {"t": "x" * 100}, {"t": "y" * 100},
                                                                   {"i": 1})]
            await bus.flushed()
            assert all(e is not None for e in events)
            large = [e for e in events if e is not None and e.size > 100]
            stream = SseStream(bus, "s1", subscriber, after=upto, upto=upto, resync=None, heartbeat=0.05,
                               write_max_bytes=large[0].size + bound_extra)
            bodies = await _pump(stream)
            assert b"".join(m["body"] for m in bodies) == b"".join(e.wire for e in events if e is not None)
            # at the bound each large event is joined like any other; one byte under its size, its
            # data is a write of its own: the event's very bytes object, not a copy
            own = [m for m in bodies if any(m["body"] is e.data for e in large)]
            assert len(own) == own_writes
            assert all(len(m["body"]) <= large[0].size + bound_extra for m in bodies if m not in own)
            bus.unsubscribe(subscriber)
    finally:
        await journal.close()
