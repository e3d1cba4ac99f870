"""Large-frame attribution (SPEC O-3..O-6): threshold, sampling, classes, bounded work, privacy."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from hopline.budget import Budget, KiB
from hopline.observe.large_frames import (
    EVENT_NAME,
    LargeFrameObserver,
    approx_json_bytes,
    attribute_frame,
    max_content_text_bytes,
)
from hopline.wire.ndjson import Frame, NdjsonDecoder, encode

BUDGET = Budget.defaults()
THRESHOLD = BUDGET.large_frame_threshold_bytes
APPROX = BUDGET.large_frame_threshold_bytes


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.wall_ms = 1_700_000_000_000

    def __call__(self) -> float:
        return self.now

    def wall(self) -> int:
        return self.wall_ms + int(self.now * 1000)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def observer(**kwargs: Any) -> tuple[LargeFrameObserver, FakeClock]:
    clock = FakeClock()
    return LargeFrameObserver(BUDGET, clock=clock, wall_clock_ms=clock.wall, **kwargs), clock


def update_note(update: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": update},
            **extra}


def attribute(message: Any, nbytes: int = THRESHOLD) -> dict[str, Any]:
    return attribute_frame("inbound", nbytes, message, threshold_bytes=THRESHOLD, approx_budget_bytes=APPROX)


def test_threshold_is_inclusive() -> None:
    obs, _ = observer()
    msg = update_note({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}})
    assert obs.observe("inbound", THRESHOLD - 1, msg) is None
    assert obs.logged_count == 0 and obs.suppressed_count == 0
    record = obs.observe("inbound", THRESHOLD, msg)
    assert record is not None and record["bytes"] == THRESHOLD and record["thresholdBytes"] == THRESHOLD
    assert obs.snapshot() == {"logged": 1, "suppressed": 0, "thresholdBytes": THRESHOLD}


class Tripwire(dict):  # type: ignore[type-arg]
    """A message that records any look inside it: suppressed frames must not be classified."""

    touched = 0

    def get(self, *args: Any, **kwargs: Any) -> Any:
        Tripwire.touched += 1
        return super().get(*args, **kwargs)

    def __contains__(self, key: object) -> bool:
        Tripwire.touched += 1
        return super().__contains__(key)

    def __getitem__(self, key: Any) -> Any:
        Tripwire.touched += 1
        return super().__getitem__(key)


def test_quota_per_window_and_suppression_counters() -> None:
    obs, clock = observer()
    msg = {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert BUDGET.large_frame_log_quota == 50
    records = [obs.observe("outbound", THRESHOLD, msg) for _ in range(50)]
    assert all(r is not None for r in records)
    window_start_ms = clock.wall()
    clock.advance(10)
    Tripwire.touched = 0
    assert obs.observe("outbound", THRESHOLD, Tripwire(msg)) is None  # the 51st
    assert obs.observe("outbound", 10 * THRESHOLD, Tripwire(msg)) is None
    assert Tripwire.touched == 0  # over quota: counted, not classified
    assert obs.snapshot() == {"logged": 50, "suppressed": 2, "thresholdBytes": THRESHOLD}
    clock.advance(BUDGET.large_frame_log_window_seconds - 10)  # exactly one window later
    record = obs.observe("outbound", THRESHOLD, msg)
    assert record is not None
    assert record["suppressedCount"] == 2
    assert record["suppressedWindowStartMs"] == window_start_ms
    following = obs.observe("outbound", THRESHOLD, msg)
    assert following is not None and "suppressedCount" not in following
    assert "suppressedWindowStartMs" not in following
    assert obs.logged_count == 52 and obs.suppressed_count == 2


def test_records_are_logged_as_structured_json(caplog: pytest.LogCaptureFixture) -> None:
    obs, _ = observer()
    caplog.set_level(logging.INFO, logger="hopline.observe")
    record = obs.observe("inbound", THRESHOLD, {"jsonrpc": "2.0", "id": 3, "result": {"x": 1}})
    [log] = [r for r in caplog.records if r.name == "hopline.observe"]
    assert orjson.loads(log.getMessage()) == {"event": EVENT_NAME, **(record or {})}
    assert log.event == EVENT_NAME  # type: ignore[attr-defined]


def test_a_failing_logger_never_escapes() -> None:
    class Broken(logging.Logger):
        def info(self, *args: Any, **kwargs: Any) -> None:
            raise OSError("disk full")

    obs, _ = observer(logger=Broken("broken"))
    assert obs.observe("inbound", THRESHOLD, {"id": 1, "result": {}}) is not None
    assert obs.failed_count == 1 and obs.logged_count == 1


REPLAY_UPDATES = [{"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                                 "content": {"type": "text", "text": "hi"}}}]


@pytest.mark.parametrize(
    ("message", "source", "kind"),
    [
        (update_note({"sessionUpdate": "plan", "entries": []}), "session_update_notification",
         "notification"),
        (update_note({"sessionUpdate": "plan"}, id=4), "jsonrpc_request", "request"),
        ({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s"}}, "jsonrpc_request",
         "notification"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"_meta": {"hopline.session.loadReplay": {
            "v": 1, "updates": REPLAY_UPDATES}}}}, "load_session_bulk_replay_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"_meta": {"qwen.session.loadReplay": {
            "updates": REPLAY_UPDATES}}}}, "load_session_bulk_replay_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"updates": REPLAY_UPDATES, "startTime": "t"}},
         "load_updates_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"updates": REPLAY_UPDATES, "lastUpdated": "t"}},
         "load_updates_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"updates": REPLAY_UPDATES, "replayError": "e"}},
         "load_updates_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"updates": REPLAY_UPDATES, "partial": False}},
         "load_updates_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"updates": REPLAY_UPDATES, "partial": "no"}},
         "jsonrpc_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"updates": REPLAY_UPDATES}}, "jsonrpc_response", "response"),
        ({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {}}, "jsonrpc_request",
         "request"),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "m"}}, "jsonrpc_response",
         "error_response"),
        ({"hello": "world"}, "unknown", "invalid"),
        ([1, 2, 3], "unknown", "invalid"),
    ],
)
def test_source_classes(message: Any, source: str, kind: str) -> None:
    record = attribute(message)
    assert record["sourceClass"] == source
    assert record["messageKind"] == kind
    if source in ("load_session_bulk_replay_response", "load_updates_response"):
        assert record["updateCount"] == 1
        assert record["sessionUpdate"] == "agent_message_chunk"
        assert record["maxContentTextBytes"] == 2
    assert "live" not in orjson.dumps(record).decode().lower()


def test_attribution_follows_the_heaviest_update() -> None:
    updates = [
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "é" * 1000}},
        {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed",
         "_meta": {"hopline.tool": {"name": "mcp__github__search", "provenance": "mcp"}},
         "content": [{"type": "content", "content": {"type": "text", "text": "a" * 5000}}],
         "rawOutput": "b" * 9000},
        {"sessionUpdate": "tool_call", "toolCallId": "c2", "kind": "read", "title": "Read a file",
         "rawOutput": {"lines": ["x" * 100] * 30}},
    ]
    msg = {"jsonrpc": "2.0", "id": 1, "result": {"updates": updates, "partial": True}}
    record = attribute(msg)
    assert record == {
        "direction": "inbound", "bytes": THRESHOLD, "thresholdBytes": THRESHOLD, "messageKind": "response",
        "sourceClass": "load_updates_response", "updateCount": 3, "mixedSessionUpdate": True,
        "sessionUpdate": "tool_call_update", "toolName": "mcp__github__search", "toolProvenance": "mcp",
        "rawOutputKind": "string", "maxContentTextBytes": 5000, "maxRawOutputTextBytes": 9000,
        "maxRawOutputApproxBytes": record["maxRawOutputApproxBytes"], "maxRawOutputApproxBytesCapped": False,
    }
    assert 3000 < record["maxRawOutputApproxBytes"] < 4000


def test_tool_name_from_kind_and_never_from_title() -> None:
    record = attribute(update_note({"sessionUpdate": "tool_call", "toolCallId": "c", "kind": "execute",
                                    "title": "rm -rf /home/secret", "rawOutput": None}))
    assert record["toolName"] == "execute" and "toolProvenance" not in record
    assert record["rawOutputKind"] == "null"
    assert "mixedSessionUpdate" not in record and record["updateCount"] == 1
    meta_path = update_note({"sessionUpdate": "tool_call", "kind": "nonsense",
                             "_meta": {"toolName": "/etc/passwd"}})
    assert "toolName" not in attribute(meta_path)
    builtin = update_note({"sessionUpdate": "tool_call", "_meta": {"toolName": "read_file"}})
    assert attribute(builtin)["toolProvenance"] == "unknown"


class CountingList(list):  # type: ignore[type-arg]
    """An update array that counts indexed reads and refuses to be iterated whole."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reads = 0

    def __getitem__(self, index: Any) -> Any:
        self.reads += 1
        return super().__getitem__(index)

    def __iter__(self) -> Any:
        raise AssertionError("the observer iterated the whole update array")


def test_large_update_arrays_are_sampled_prefix_and_suffix() -> None:
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}
    updates = CountingList([chunk] * 100_000)
    updates[99_999 - 10] = {"sessionUpdate": "tool_call_update", "rawOutput": "y" * 50}  # in the tail
    updates[1000] = {"sessionUpdate": "tool_call_update", "rawOutput": "z" * 5000}  # never sampled
    updates.reads = 0
    msg = {"jsonrpc": "2.0", "id": 1, "result": {"_meta": {"hopline.session.loadReplay": {
        "v": 1, "updates": updates}}}}
    record = attribute(msg)
    assert updates.reads == 500
    assert record["updateCount"] == 100_000
    assert record["summarizedUpdateCount"] == 500
    assert record["summarizedUpdateStrategy"] == "prefix_and_suffix"
    assert record["maxRawOutputTextBytes"] == 50  # from the suffix; the unsampled 5000 is not seen
    assert record["mixedSessionUpdate"] is True


def test_500_updates_are_not_summarized() -> None:
    updates = [{"sessionUpdate": "plan"}] * 500
    record = attribute({"id": 1, "result": {"updates": updates, "startTime": "t"}})
    assert record["updateCount"] == 500 and "summarizedUpdateCount" not in record
    assert record["mixedSessionUpdate"] is False


def _nested(depth: int, leaf: Any) -> Any:
    node = leaf
    for _ in range(depth):
        node = [node]
    return node


def test_deep_nesting_is_walked_to_depth_32_without_recursion_error() -> None:
    deep = _nested(200_000, {"type": "text", "text": "t" * 99})
    assert max_content_text_bytes(deep) == 0
    assert max_content_text_bytes(_nested(31, {"type": "text", "text": "t" * 99})) == 99
    assert max_content_text_bytes(_nested(40, {"type": "text", "text": "t" * 99})) == 0
    size, capped = approx_json_bytes(deep, APPROX)
    assert capped and size < 1000
    shallow_size, shallow_capped = approx_json_bytes(_nested(10, "abc"), APPROX)
    assert not shallow_capped and shallow_size == 5 + 10 * 3
    record = attribute(update_note({"sessionUpdate": "tool_call_update", "content": deep, "rawOutput": deep}))
    assert record["maxContentTextBytes"] == 0 and record["maxRawOutputApproxBytesCapped"] is True


def test_raw_output_walk_is_cycle_safe_and_calls_no_hooks() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise AssertionError("__str__ called")

        __repr__ = __str__

        def __len__(self) -> int:
            raise AssertionError("__len__ called")

        def __iter__(self) -> Any:
            raise AssertionError("__iter__ called")

    class HostileDict(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise AssertionError("items called")

    cyclic: dict[str, Any] = {"name": "n"}
    loop: list[Any] = [cyclic]
    cyclic["self"] = cyclic
    cyclic["loop"] = loop
    loop.append(loop)
    raw = {"a": cyclic, "b": Hostile(), "c": HostileDict(x=1), "d": (1, 2.5, True, None, 10**400)}
    size, capped = approx_json_bytes(raw, APPROX)
    assert 0 < size < 1000 and not capped
    record = attribute(update_note({"sessionUpdate": "tool_call_update", "rawOutput": raw}))
    assert record["rawOutputKind"] == "object"
    assert record["maxRawOutputApproxBytes"] == size


def test_non_string_raw_output_is_capped_at_the_budget() -> None:
    raw = {"rows": ["r" * 1000 for _ in range(1000)]}  # about 1 MB
    record = attribute(update_note({"sessionUpdate": "tool_call_update", "rawOutput": raw}))
    assert record["maxRawOutputApproxBytes"] == APPROX == 256 * KiB
    assert record["maxRawOutputApproxBytesCapped"] is True
    assert record["rawOutputKind"] == "object"
    exact = len(orjson.dumps({"rows": ["r" * 1000, 12345, None]}))
    size, capped = approx_json_bytes({"rows": ["r" * 1000, 12345, None]}, APPROX)
    assert not capped and abs(size - exact) <= 8  # approximate: separators are estimated


def test_strings_are_cut_to_128_characters() -> None:
    long_kind = "k" * 300
    record = attribute({"jsonrpc": "2.0", "method": "m" * 300, "params": {"update": {"sessionUpdate": "x"}}})
    assert record["method"] == "m" * 128
    record = attribute(update_note({"sessionUpdate": long_kind}))
    assert record["sessionUpdate"] == "k" * 128


CANARY = "CANARY7f3a"


def test_no_payload_session_id_path_prompt_or_raw_output_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A real large frame full of canaries goes through the codec and the observer; none is logged."""
    update = {
        "sessionUpdate": "tool_call_update", "toolCallId": f"call-{CANARY}",
        "title": f"Read /home/{CANARY}/secrets.txt", "kind": "read", "status": "completed",
        "locations": [{"path": f"/home/{CANARY}/secrets.txt", "line": 1}],
        "content": [{"type": "content", "content": {"type": "text", "text": f"{CANARY} " * 40_000}},
                    {"type": "diff", "path": f"/srv/{CANARY}.py", "oldText": CANARY, "newText": CANARY}],
        "rawOutput": {"stdout": f"{CANARY} " * 10_000, "file": f"/tmp/{CANARY}", CANARY: [CANARY]},
        "rawInput": {"command": f"cat /home/{CANARY}", "prompt": f"prompt {CANARY}"},
        "_meta": {"toolName": f"/bin/{CANARY}", "clientId": f"client-{CANARY}"},
    }
    frames = [
        update_note(update) | {"params": {"sessionId": f"sess-{CANARY}", "update": update}},
        {"jsonrpc": "2.0", "id": 9, "method": "session/prompt",
         "params": {"sessionId": f"sess-{CANARY}", "prompt": [{"type": "text", "text": CANARY * 70_000}]}},
        {"jsonrpc": "2.0", "id": 9, "result": {"_meta": {"hopline.session.loadReplay": {
            "v": 1, "updates": [{"sessionId": f"sess-{CANARY}", "update": update}] * 3}}}},
    ]
    stream = b"".join(encode(f) for f in frames)
    decoder = NdjsonDecoder(BUDGET.pipe_max_frame_bytes)
    obs, _ = observer()
    caplog.set_level(logging.DEBUG)
    records = []
    for i in range(0, len(stream), 4096):
        for frame in decoder.feed(stream[i:i + 4096]):
            assert isinstance(frame, Frame)
            assert frame.size >= THRESHOLD
            records.append(obs.observe("inbound", frame.size, frame.message))
    assert len(records) == 3 and all(r is not None for r in records)
    assert records[0]["toolName"] == "read"  # the path-like _meta name was refused
    assert records[0]["maxContentTextBytes"] == len(f"{CANARY} ") * 40_000
    assert records[2]["sourceClass"] == "load_session_bulk_replay_response"
    assert caplog.records, "nothing was logged"
    logged = caplog.text + "".join(str(getattr(r, "record", "")) for r in caplog.records)
    assert CANARY not in logged
    assert CANARY.lower() not in logged.lower()
    assert CANARY not in orjson.dumps(records).decode()


def test_recent_keeps_the_newest_logged_records_up_to_its_ceiling() -> None:
    """The records ``GET /daemon/frames`` shows: at most ``large_frame_recent_records``, newest
    first, each the logged record plus its time; suppressed frames are counted, not kept."""
    msg = {"jsonrpc": "2.0", "id": 1, "result": {}}
    keep = 3
    budget = BUDGET.replace(large_frame_recent_records=keep, large_frame_log_quota=keep + 1)
    clock = FakeClock()
    obs = LargeFrameObserver(budget, clock=clock, wall_clock_ms=clock.wall)
    logged = []
    for i in range(keep):  # exactly at the ceiling: all kept
        clock.advance(1)
        logged.append(obs.observe("inbound", THRESHOLD + i, msg))
    assert [r["bytes"] for r in obs.recent()] == [THRESHOLD + 2, THRESHOLD + 1, THRESHOLD]
    clock.advance(1)
    logged.append(obs.observe("inbound", THRESHOLD + keep, msg))  # one over: the oldest goes
    assert [r["bytes"] for r in obs.recent()] == [THRESHOLD + 3, THRESHOLD + 2, THRESHOLD + 1]
    assert obs.observe("inbound", 10 * THRESHOLD, msg) is None  # over the log quota: suppressed
    newest = obs.recent()[0]
    assert newest["bytes"] == THRESHOLD + 3
    assert newest == {**logged[-1], "atMs": clock.wall()}
    none_kept = LargeFrameObserver(BUDGET.replace(large_frame_recent_records=0))
    assert none_kept.observe("inbound", THRESHOLD, msg) is not None and none_kept.recent() == []
