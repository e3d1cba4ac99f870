"""DaemonClient against a real SSE server on 127.0.0.1: order, shapes, resume, bounds, sidecars."""

from __future__ import annotations

from contextlib import aclosing

import pytest

from hopline.budget import Budget
from hopline.client import (
    DaemonClient,
    DaemonError,
    Event,
    SidecarIntegrityError,
    SseEventTooLarge,
    SseReconnectExhausted,
)

from .conftest import SIDECAR_BODY, SIDECAR_SHA, TOKEN, TOTAL_EVENTS, RunningServer


def _client(server: RunningServer, **budget_changes: int) -> DaemonClient:
    budget = Budget.defaults().replace(**budget_changes) if budget_changes else Budget.defaults()
    return DaemonClient(server.url, TOKEN, budget=budget)


async def _take(client: DaemonClient, sid: str, count: int, **kwargs: object) -> list[Event]:
    out: list[Event] = []
    async with aclosing(client.events(sid, **kwargs)) as stream:  # type: ignore[arg-type]
        async for event in stream:
            out.append(event)
            if len(out) == count:
                break
    return out


async def test_event_shapes_and_line_endings(sse_server: RunningServer) -> None:
    async with _client(sse_server) as client:
        events = []
        async with aclosing(client.events("shapes")) as stream:
            async for event in stream:
                events.append(event)
                if event.type == "replay_complete":
                    break
    # Non-JSON data is reported as invalid_event (type and size, no payload), never dropped.
    assert [(e.id, e.type) for e in events] == [(1, "invalid_event")] * 1 + [
        (2, "invalid_event"), (3, "invalid_event"), (4, "invalid_event"), (None, "replay_complete")]
    assert [e.data["event"] for e in events[:4]] == ["a", "b", "c", "d"]
    assert [e.size for e in events[:4]] == [len("1a") + len("crlf"), len("2b") + len("cr"),
                                            len("3c") + len("one\ntwo\n"), len("4d") + len("split")]
    assert events[0].data["error"] == "data is not JSON"
    assert events[4].data == {"no": "id"} and events[4].synthetic


async def test_resume_after_clean_end_no_loss_no_duplicate(sse_server: RunningServer) -> None:
    sse_server.log.last_event_ids.clear()
    async with _client(sse_server) as client:
        events = await _take(client, "clean", TOTAL_EVENTS)
        assert client.reconnects >= 2
    assert [e.id for e in events] == list(range(1, TOTAL_EVENTS + 1))
    assert all(e.data["n"] == e.id and e.data["text"] == "line a\nline b" for e in events)
    # Each reconnect asked for what followed the last event it had seen.
    assert sse_server.log.last_event_ids[:3] == [None, "5", "9"]


async def test_resume_after_connection_killed_mid_event(sse_server: RunningServer) -> None:
    sse_server.log.last_event_ids.clear()
    async with _client(sse_server) as client:
        events = await _take(client, "killed", TOTAL_EVENTS, last_event_id=0)
    assert [e.id for e in events] == list(range(1, TOTAL_EVENTS + 1))
    assert sse_server.log.last_event_ids[:3] == ["0", "4", "8"]


async def test_event_of_exactly_the_limit_passes(sse_server: RunningServer) -> None:
    limit = 64 * 1024
    # id "1" + event "big" = 4 bytes of the event's size; the rest is data.
    async with _client(sse_server, client_sse_max_event_bytes=limit) as client:
        events = await _take(client, f"sized-{limit - 4}-4096", 2)
        client_max = client.max_buffered
    # Not JSON, so reported as invalid_event with its size: the whole event arrived.
    client_bytes = events[0].data["bytes"]
    assert client_bytes == limit
    assert events[1].type == "small"
    assert client_max <= limit + 4096


@pytest.mark.parametrize("chunk", [1000, 4096])
async def test_event_one_byte_over_the_limit_raises_clear_error(sse_server: RunningServer,
                                                                chunk: int) -> None:
    limit = 64 * 1024
    async with _client(sse_server, client_sse_max_event_bytes=limit) as client:
        with pytest.raises(SseEventTooLarge) as err:
            await _take(client, f"sized-{limit - 3}-{chunk}", 2, max_queued=16)
        assert client.max_buffered <= limit + chunk
    assert err.value.limit == limit
    assert str(err.value).startswith(f"hop client.sse: event exceeds {limit} bytes (read ")
    assert err.value.observed > limit


async def test_unauthorized_stream_is_an_error_not_a_retry(sse_server: RunningServer) -> None:
    async with DaemonClient(sse_server.url, "wrong", budget=Budget.defaults()) as client:
        with pytest.raises(DaemonError) as err:
            await _take(client, "clean", 1)
    assert err.value.status == 401


async def test_resolve_sidecar_verifies_hash_and_size(sse_server: RunningServer) -> None:
    entry = {"field": "rawOutput", "id": "good", "bytes": len(SIDECAR_BODY), "sha256": SIDECAR_SHA,
             "mediaType": "text/plain"}
    async with _client(sse_server) as client:
        assert await client.resolve_sidecar("s", entry) == SIDECAR_BODY
        with pytest.raises(SidecarIntegrityError, match="sha256 mismatch"):
            await client.resolve_sidecar("s", dict(entry, id="tampered"))
        with pytest.raises(SidecarIntegrityError, match="exceeds its declared"):
            await client.resolve_sidecar("s", dict(entry, id="longer"))
        with pytest.raises(SidecarIntegrityError, match="declared"):
            await client.resolve_sidecar("s", dict(entry, bytes=len(SIDECAR_BODY) + 1))
        with pytest.raises(SidecarIntegrityError, match="not resolvable"):
            await client.resolve_sidecar("s", {"field": "rawOutput", "truncated": True, "bytes": 9})
        with pytest.raises(DaemonError) as err:
            await client.resolve_sidecar("s", dict(entry, id="missing"))
    assert err.value.status == 404 and err.value.hop == "daemon.sidecars"


async def test_state_resync_follows_the_daemons_numbering(sse_server: RunningServer) -> None:
    async with _client(sse_server) as client:
        events = await _take(client, "resync", 4, last_event_id=50)
    assert events[0].type == "state_resync_required" and events[0].synthetic
    assert [e.id for e in events[1:]] == [4, 5, 6]


async def test_reconnects_are_bounded_with_a_clear_error(sse_server: RunningServer) -> None:
    before = sse_server.log.connections
    async with DaemonClient(sse_server.url, TOKEN, budget=Budget.defaults(), reconnect_attempts=3,
                            reconnect_backoff_seconds=0.01) as client:
        with pytest.raises(SseReconnectExhausted) as err:
            await _take(client, "empty", 1)
        assert client.reconnects == 3
    assert sse_server.log.connections - before == 4  # the first connection and 3 reconnects
    assert str(err.value).startswith("hop client.sse: event stream lost after 3 reconnect attempts")
