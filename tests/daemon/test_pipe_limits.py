"""A frame the pipe cannot relay (over the max frame, not JSON, not UTF-8, cut by the end of the
stream): dropped with a `frame_dropped` event naming why, measured in `runtime.perf.pipe`, and the
session goes on."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from .support import read_events, running_daemon
from .test_serve import kill_child_until_detached, new_session, prompt, texts, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes

MiB = 1024 * 1024


async def test_frame_over_the_pipe_max_is_dropped_and_the_session_goes_on(tmp_path: Path) -> None:
    env = {"HOPLINE_PIPE_MAX_FRAME_BYTES": "1mb", "HOPLINE_AGENT_MAX_FRAME_BYTES": "1mb",
           "HOPLINE_BULK_REPLAY_MAX_BYTES": "64kb", "HOPLINE_SSE_HEARTBEAT_SECONDS": "0.2"}
    with running_daemon(tmp_path, env=env) as daemon:
        async with daemon.client() as client:
            sid = await new_session(client, tmp_path)
            # subscribe first: frame_dropped is a live (synthetic) event
            first = await prompt(client, sid, "echo warm")
            warm = await read_events(client, sid, turns_done(1))
            assert warm[-1].data["promptId"] == first
            async with client.stream("GET", f"/session/{sid}/events",
                                     headers={"Last-Event-ID": str(warm[-1].id)}) as stream:
                from .support import iter_sse

                await prompt(client, sid, f"big {MiB}")
                events = []
                async for event in iter_sse(stream):
                    events.append(event)
                    if event.type in ("turn_complete", "turn_error"):
                        break
            dropped = [e for e in events if e.type == "frame_dropped"]
            assert len(dropped) == 1 and dropped[0].id is None
            data = dropped[0].data
            assert data["direction"] == "inbound" and data["reason"] == "frame_too_large"
            assert data["limit"] == MiB and data["bytes"] > MiB
            assert data["setting"] == "HOPLINE_PIPE_MAX_FRAME_BYTES"
            # the frames around the dropped one arrived, and the turn completed
            kinds = [e.data["update"]["sessionUpdate"] for e in events if e.type == "session_update"]
            assert kinds == ["tool_call", "agent_message_chunk"]
            assert texts(events) == ["big done"] and events[-1].type == "turn_complete"
            # the next prompt on the same session completes
            await prompt(client, sid, "echo after")
            after = await read_events(client, sid, turns_done(1), last_event_id=events[-1].id)
            assert texts(after) == ["echo: echo after"] and after[-1].type == "turn_complete"
            status = (await client.get("/daemon/status")).json()
            assert status["framesDropped"] == 1
            # D-8: the dropped frame is measured, and its turn says what it lost
            inbound = status["runtime"]["perf"]["pipe"]["inbound"]
            assert (inbound["dropped"], inbound["droppedBytes"], inbound["maxDroppedBytes"]) == \
                (1, data["bytes"], data["bytes"])
            assert status["runtime"]["perf"]["pipe"]["outbound"]["dropped"] == 0
            assert events[-1].data["lostBytes"] == data["bytes"] and events[-1].data["degraded"] is True
            assert status["delivery"]["lostByReason"] == {"frame_too_large": 1}
            records = [orjson.loads(line) for line in daemon.log_text().splitlines()
                       if "hopline.daemon.pipe.large_frame" in line]
            [unknown] = [r["record"] for r in records if r["record"]["sourceClass"] == "unknown"]
            assert unknown["bytes"] == data["bytes"] and unknown["sourceClass"] == "unknown"

            # D-6 by bytes: a bulk replay response over HOPLINE_BULK_REPLAY_MAX_BYTES is refused
            for count, ok in ((2000, False), (100, True)):
                replayed = await new_session(client, tmp_path, scripted={"replayUpdates": count})
                await kill_child_until_detached(client, replayed)
                response = await client.post(f"/session/{replayed}/load")
                if ok:
                    assert response.status_code == 200 and response.json()["replayedUpdates"] == 100
                    continue
                assert response.status_code == 422
                error = response.json()["error"]
                assert error["hop"] == "daemon.replay" and error["limit"] == 64 * 1024
                assert error["observed"] > 64 * 1024
                observed = error["observed"]
                assert error["message"] == (f"bulk replay of {observed} bytes exceeds the limit of "
                                            f"{64 * 1024} bytes (HOPLINE_BULK_REPLAY_MAX_BYTES)")
            # an idle stream gets heartbeat comments (D-3)
            async with client.stream("GET", f"/session/{sid}/events",
                                     headers={"Last-Event-ID": str(after[-1].id)}) as idle:
                raw = b""
                async for chunk in idle.aiter_bytes():
                    raw += chunk
                    if raw.count(b": heartbeat\n\n") >= 2:
                        break
                assert b"event: replay_complete" in raw and b"id:" not in raw
        assert "pipe frame dropped" in daemon.log_text()


async def test_frames_that_are_not_json_or_utf8_or_cut_by_eof_are_dropped_counted_and_said(
        tmp_path: Path) -> None:
    """#13 item 3 beyond the oversize case: a test agent writes bad frames on its real stdout."""
    from .support import iter_sse

    big = 300 * 1024  # at or over the 256 KiB large-frame threshold: a record of origin unknown
    with running_daemon(tmp_path) as daemon:
        async with daemon.client() as client:
            sid = await new_session(client, tmp_path)
            await prompt(client, sid, "echo warm")
            warm = await read_events(client, sid, turns_done(1))
            events = []
            # subscribed before the bad frames: frame_dropped is a live (synthetic) event
            async with client.stream("GET", f"/session/{sid}/events",
                                     headers={"Last-Event-ID": str(warm[-1].id)}) as stream:
                sse = iter_sse(stream)  # one reader of the one stream, turn after turn
                for command in (f"raw json {big}", "raw utf8 1000", "raw eof 500"):
                    await prompt(client, sid, command)
                    async for event in sse:
                        events.append(event)
                        if event.type in ("turn_complete", "turn_error"):
                            break
            status = (await client.get("/daemon/status")).json()
    dropped = [e.data for e in events if e.type == "frame_dropped"]
    assert [(d["reason"], d["bytes"], d["direction"]) for d in dropped] == [
        ("invalid_json", big, "inbound"), ("invalid_utf8", 1000, "inbound"),
        ("incomplete_frame", 500, "inbound")]
    assert all(e.id is None for e in events if e.type == "frame_dropped")  # live notices, not journaled
    ends = [e for e in events if e.type in ("turn_complete", "turn_error")]
    assert [e.type for e in ends] == ["turn_complete", "turn_complete", "turn_error"]
    assert texts(events) == ["raw done", "raw done"]  # the frames around a dropped one arrived
    inbound = status["runtime"]["perf"]["pipe"]["inbound"]
    assert (inbound["dropped"], inbound["droppedBytes"], inbound["maxDroppedBytes"]) == (3, big + 1500, big)
    assert status["framesDropped"] == 3
    records = [orjson.loads(line)["record"] for line in daemon.log_text().splitlines()
               if "hopline.daemon.pipe.large_frame" in line]
    unknown = [r for r in records if r["sourceClass"] == "unknown"]
    assert [r["bytes"] for r in unknown] == [big]  # the small ones are under the threshold
    assert "nnnnnnnn" not in daemon.log_text()  # sizes only, never the frame
