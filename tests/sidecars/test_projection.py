"""Projection (S-1) and fallback (S-2) on the inbound path: pure shapes, a real store underneath."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from acp.schema import ToolCallProgress

from hopline.budget import Budget
from hopline.sidecars.projection import JSON_MEDIA_TYPE, TEXT_MEDIA_TYPE, preview_text, restore_update
from hopline.sidecars.store_projection import (
    aproject_message,
    needs_projection,
    project_message,
    project_update,
)

from .conftest import CountingStore

StoreFactory = Callable[..., CountingStore]
MiB = 1024 * 1024


def tool_update(text: str | None = None, raw: Any = None, kind: str = "tool_call_update") -> dict[str, Any]:
    update: dict[str, Any] = {"sessionUpdate": kind, "toolCallId": "call-1", "status": "completed"}
    if text is not None:
        update["content"] = [{"type": "content", "content": {"type": "text", "text": text}}]
    if raw is not None:
        update["rawOutput"] = raw
    return update


def big_text(size: int) -> str:
    head = "HEAD-" + "h" * 2000
    tail = "t" * 2000 + "-TAIL"
    return head + "m" * (size - len(head) - len(tail)) + tail


def test_five_mib_update_is_projected_under_the_threshold(make_store: StoreFactory) -> None:
    store = make_store()
    budget = store.budget
    text = big_text(5 * MiB)
    update = tool_update(text)
    original = copy.deepcopy(update)
    projected = project_update(update, "s1", store, budget)
    assert update == original  # the input is never mutated
    assert len(orjson.dumps(projected)) < budget.sidecar_threshold_bytes
    meta = projected["_meta"]["hopline.sidecar"]
    assert len(meta) == 1
    entry = meta[0]
    assert entry["field"] == "content[0].content.text" and entry["path"] == ["content", 0, "content", "text"]
    assert entry["bytes"] == 5 * MiB and entry["mediaType"] == TEXT_MEDIA_TYPE
    stored = store.get("s1", entry["id"])
    assert stored is not None and stored.sha256 == entry["sha256"]
    assert store.read_bytes(stored) == text.encode()
    preview = projected["content"][0]["content"]["text"]
    assert preview.startswith("HEAD-") and preview.endswith("-TAIL")
    assert f"[hopline: {5 * MiB} bytes in sidecar {entry['id']}; 2048 shown]" in preview
    stats = store.stats()
    assert stats["bytesKeptOffWire"] == 5 * MiB - len(orjson.dumps(preview))  # the preview's JSON


def _sized(update: dict[str, Any], target: int, field: str = "rawOutput", char: str = "a") -> dict[str, Any]:
    """``update`` with ``field`` a string of ``char`` that makes its compact JSON exactly ``target`` bytes."""
    base = len(orjson.dumps({**update, field: ""}))
    room = target - base
    count = room // len(char.encode())
    assert count * len(char.encode()) == room, "target not reachable with this character"
    sized = {**update, field: char * count}
    assert len(orjson.dumps(sized)) == target
    return sized


SMALL = Budget.defaults().replace(sidecar_threshold_bytes=1000, sidecar_preview_bytes=100)


def test_exactly_at_threshold_passes_one_byte_over_moves(make_store: StoreFactory) -> None:
    """The threshold applies to the whole update's compact JSON, in UTF-8 bytes (S-4)."""
    store = make_store(SMALL)
    head = tool_update("c" * 300)
    at_limit = _sized(head, 1000)
    assert project_update(at_limit, "s1", store, store.budget) is at_limit
    over = _sized(head, 1001)
    projected = project_update(over, "s1", store, store.budget)
    assert len(orjson.dumps(projected)) <= 1000
    [entry] = projected["_meta"]["hopline.sidecar"]  # the largest field is enough
    assert entry["field"] == "rawOutput" and entry["path"] == ["rawOutput"]
    assert f"{len(over['rawOutput'])} bytes in sidecar" in projected["rawOutput"]
    assert projected["content"] == head["content"]
    # multi-byte characters count in UTF-8 bytes, not characters: 3 bytes for one "€"
    base = len(orjson.dumps({**head, "rawOutput": ""}))
    euro_at = {**head, "rawOutput": "€" * ((1000 - base) // 3)}
    assert 998 <= len(orjson.dumps(euro_at)) <= 1000 < len(orjson.dumps(euro_at)) + 3
    assert project_update(euro_at, "s1", store, store.budget) is euro_at
    euro_over = {**head, "rawOutput": euro_at["rawOutput"] + "€"}
    assert project_update(euro_over, "s1", store, store.budget) is not euro_over


def _chunk(kind: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": kind[0] * 5000}}


@pytest.mark.parametrize(("update", "field"), [
    (_chunk("agent_message_chunk"), "content.text"),
    (_chunk("agent_thought_chunk"), "content.text"),
    (_chunk("user_message_chunk"), "content.text"),
    ({"sessionUpdate": "plan", "entries": [{"content": f"step {i}", "priority": "high", "status": "pending"}
                                           for i in range(200)]}, "entries"),
    ({"sessionUpdate": "available_commands_update",
      "availableCommands": [{"name": f"cmd{i}", "description": "d" * 40} for i in range(200)]},
     "availableCommands"),
    ({"sessionUpdate": "x_vendor_kind", "small": "s", "data": {"blob": "b" * 5000, "n": 1}}, "data.blob"),
    ({"sessionUpdate": "x_vendor_kind", "rows": [[i, "r" * 20] for i in range(300)]}, "rows"),
    ({"sessionUpdate": "tool_call", "toolCallId": "c", "rawInput": {"command": "k" * 5000}},
     "rawInput.command"),
])
def test_every_kind_is_projected_and_restores_exactly(make_store: StoreFactory, update: dict[str, Any],
                                                      field: str) -> None:
    store = make_store(SMALL)
    original = copy.deepcopy(update)
    projected = project_update(update, "s1", store, store.budget)
    assert update == original
    assert len(orjson.dumps(projected)) <= 1000
    [entry] = projected["_meta"]["hopline.sidecar"]
    assert entry["field"] == field
    value = update
    for part in entry["path"]:
        value = value[part]
    assert entry["mediaType"] == (TEXT_MEDIA_TYPE if isinstance(value, str) else JSON_MEDIA_TYPE)
    if isinstance(value, list):  # an array keeps its leading items: still an array on the wire
        shown = projected
        for part in entry["path"]:
            shown = shown[part]
        assert entry["items"] == len(value) and entry["itemsShown"] == len(shown) > 0
        assert shown == value[:len(shown)] and len(orjson.dumps(shown)) <= 100

    def body(e: dict[str, Any]) -> bytes:
        stored = store.get("s1", e["id"])
        assert stored is not None
        data = store.read_bytes(stored)
        assert data is not None and hashlib.sha256(data).hexdigest() == e["sha256"]
        return data

    assert restore_update(projected, body) == original


def test_odd_shapes_never_raise(make_store: StoreFactory) -> None:
    store = make_store(SMALL)
    big = "x" * 5000
    untouched: list[Any] = [
        None, 42, "text", [big],
        {"sessionUpdate": "tool_call", "rawOutput": {"n": 2**70, "pad": big}},  # orjson cannot encode it
        {"sessionUpdate": "tool_call", "rawOutput": {"small": True}},
        {"sessionUpdate": ["tool_call"]},
        {"sessionUpdate": "x", **{f"k{i}": i for i in range(300)}},  # nothing worth moving: only numbers
    ]
    for update in untouched:
        assert project_update(update, "s1", store, store.budget) is update
    odd_meta = {"sessionUpdate": "tool_call", "rawOutput": big, "_meta": "not a dict"}
    projected = project_update(odd_meta, "s1", store, store.budget)
    assert projected["_meta"]["hopline.sidecar"][0]["field"] == "rawOutput"
    odd = {"sessionUpdate": "tool_call_update", "content": [None, 3, big, {"type": "content"},
                                                            {"type": "content", "content": big}]}
    projected = project_update(odd, "s1", store, store.budget)
    assert [e["field"] for e in projected["_meta"]["hopline.sidecar"]] == ["content"]


def test_existing_meta_is_kept_and_extended(make_store: StoreFactory) -> None:
    store = make_store(SMALL)
    agent_entry = {"field": "content[1].text", "id": "x" * 32, "bytes": 9, "sha256": "0", "mediaType": "t/p"}
    update = {**tool_update(raw="r" * 2000), "_meta": {"other": 1, "hopline.sidecar": [agent_entry]}}
    projected = project_update(update, "s1", store, store.budget)
    assert projected["_meta"]["other"] == 1
    assert projected["_meta"]["hopline.sidecar"][0] == agent_entry
    assert projected["_meta"]["hopline.sidecar"][1]["field"] == "rawOutput"
    assert update["_meta"]["hopline.sidecar"] == [agent_entry]


def test_a_raw_output_object_keeps_its_shape(make_store: StoreFactory) -> None:
    """Only the large member moves: exitCode and the small list stay in place, whole."""
    store = make_store()
    raw = {"stdout": "o" * 100_000, "exitCode": 0, "files": [{"name": "ä", "size": 1}]}
    projected = project_update(tool_update(raw=raw, kind="tool_call"), "s1", store, store.budget)
    kept = projected["rawOutput"]
    assert kept["exitCode"] == 0 and kept["files"] == raw["files"]
    [entry] = projected["_meta"]["hopline.sidecar"]
    assert entry["field"] == "rawOutput.stdout" and entry["path"] == ["rawOutput", "stdout"]
    assert entry["mediaType"] == TEXT_MEDIA_TYPE and "100000 bytes in sidecar" in kept["stdout"]
    stored = store.get("s1", entry["id"])
    assert stored is not None and store.read_bytes(stored) == raw["stdout"].encode()


def test_an_object_of_small_members_moves_as_a_json_stub(make_store: StoreFactory) -> None:
    """No member is large enough to move alone: the object goes whole, as a JSON sidecar."""
    store = make_store()
    raw = {f"k{i}": "v" * 900 for i in range(120)}  # 120 members of 900 bytes: none over the preview
    assert store.budget.sidecar_preview_bytes >= 900 + 2
    projected = project_update(tool_update(raw=raw, kind="tool_call"), "s1", store, store.budget)
    stub = projected["rawOutput"]
    [entry] = projected["_meta"]["hopline.sidecar"]
    assert entry["field"] == "rawOutput" and entry["mediaType"] == JSON_MEDIA_TYPE
    assert stub["hopline.sidecar"] == entry["id"] and stub["bytes"] == len(orjson.dumps(raw))
    stored = store.get("s1", entry["id"])
    assert stored is not None and orjson.loads(store.read_bytes(stored) or b"") == raw


def test_preview_cuts_on_utf8_boundaries() -> None:
    for char in ["é", "€", "🙂", "a"]:
        data = (char * 5000).encode()
        for preview_bytes in (0, 1, 2, 3, 7, 2048):
            text = preview_text(data, preview_bytes, "i" * 32)
            head, _, rest = text.partition("\n… [hopline:")
            tail = rest.split("] …\n", 1)[1]
            shown = len(head.encode()) + len(tail.encode())
            assert shown <= preview_bytes
            assert set(head) <= {char} and set(tail) <= {char}
            assert f"; {shown} shown]" in text
            assert preview_bytes - shown < 2 * len(char.encode())  # as much as fits


@pytest.mark.parametrize(("limits", "reason", "key"), [
    ({"sidecar_max_object_bytes": 150_000}, "over_object_quota", "overObjectQuota"),
    ({"sidecar_max_session_bytes": 150_000}, "over_session_quota", "overSessionQuota"),
    ({"sidecar_max_store_bytes": 150_000}, "over_store_quota", "overStoreQuota"),
])
def test_quota_fallback_is_a_flagged_truncated_preview(make_store: StoreFactory, limits: dict[str, int],
                                                       reason: str, key: str) -> None:
    store = make_store(Budget.defaults().replace(**limits))
    fits = project_update(tool_update("a" * 150_000), "s1", store, store.budget)  # exactly at the limit
    assert "id" in fits["_meta"]["hopline.sidecar"][0]
    # one byte over the object limit; the session/store is already full, so any more is over
    over = tool_update(raw="b" * (150_001 if reason == "over_object_quota" else 70_000))
    projected = project_update(over, "s1", store, store.budget)
    entry = projected["_meta"]["hopline.sidecar"][0]
    assert entry["truncated"] is True and entry["reason"] == reason and "id" not in entry
    assert entry["field"] == "rawOutput" and entry["bytes"] == len(over["rawOutput"])
    assert entry["lostBytes"] == len(over["rawOutput"]) - store.budget.sidecar_preview_bytes
    assert f"bytes, truncated ({reason});" in projected["rawOutput"]
    assert projected["rawOutput"].startswith("b" * 1024) and len(projected["rawOutput"]) < 2200
    assert store.stats()["fallbacks"][key] == 1


def test_fallback_for_non_string_raw_output(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_max_object_bytes=100_000))
    update = tool_update(raw={"x": "y" * 100_001, "exitCode": 3})
    projected = project_update(update, "s1", store, store.budget)
    kept = projected["rawOutput"]
    assert kept["exitCode"] == 3 and "truncated (over_object_quota)" in kept["x"]
    [entry] = projected["_meta"]["hopline.sidecar"]
    assert entry["truncated"] is True and entry["path"] == ["rawOutput", "x"]


def test_client_ignoring_meta_reads_the_preview_through_the_acp_sdk(make_store: StoreFactory) -> None:
    store = make_store()
    projected = project_update(tool_update(big_text(300_000)), "s1", store, store.budget)
    model = ToolCallProgress.model_validate(orjson.loads(orjson.dumps(projected)))
    assert model.content is not None
    text = model.content[0].content.text  # type: ignore[union-attr]
    assert text.startswith("HEAD-") and text.endswith("-TAIL")
    assert "300000 bytes in sidecar" in text


def test_notifications_and_replays_are_projected(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_threshold_bytes=100, sidecar_preview_bytes=50))
    big = tool_update(raw="r" * 500)
    note = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "child", "update": big}}
    out = project_message(note, "daemon-s", store, store.budget)
    assert out["params"]["sessionId"] == "child"
    sidecar_id = out["params"]["update"]["_meta"]["hopline.sidecar"][0]["id"]
    assert store.get("daemon-s", sidecar_id) is not None
    assert note["params"]["update"] is big  # not mutated

    small = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}
    replay = {"jsonrpc": "2.0", "id": 7, "result": {"_meta": {"hopline.session.loadReplay": {
        "v": 1, "updates": [small, {"sessionId": "child", "update": tool_update(raw="q" * 500)}]}}}}
    out = project_message(replay, "daemon-s", store, store.budget)
    updates = out["result"]["_meta"]["hopline.session.loadReplay"]["updates"]
    assert updates[0] is small
    assert "500 bytes in sidecar" in updates[1]["update"]["rawOutput"]
    page = {"jsonrpc": "2.0", "id": 8, "result": {"updates": [tool_update(raw="p" * 500)], "partial": False}}
    paged = project_message(page, "daemon-s", store, store.budget)
    assert "hopline.sidecar" in paged["result"]["updates"][0]["_meta"]
    for message in [{"jsonrpc": "2.0", "id": 1, "result": {}}, {"method": "x"}, "junk",
                    {"method": "session/update", "params": "odd"}]:
        assert project_message(message, "daemon-s", store, store.budget) is message


async def test_async_projection_skips_messages_without_an_update(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_threshold_bytes=100, sidecar_preview_bytes=50))
    chunk = {"method": "session/update", "params": {"update": "not an update"}}
    assert not needs_projection(chunk)
    assert await aproject_message(chunk, "s", store, store.budget) is chunk
    note = {"method": "session/update", "params": {"update": tool_update(raw="r" * 500)}}
    assert needs_projection(note)
    out = await aproject_message(note, "s", store, store.budget)
    assert out["params"]["update"]["_meta"]["hopline.sidecar"][0]["bytes"] == 500


def test_disk_error_falls_back_and_the_update_still_goes_out(make_store: StoreFactory) -> None:
    store = make_store(SMALL)
    store.tmp_dir.rmdir()
    store.tmp_dir.write_bytes(b"not a directory")  # a real failing write, no patching
    projected = project_update(tool_update("z" * 5000), "s1", store, store.budget)
    entry = projected["_meta"]["hopline.sidecar"][0]
    assert entry == {"field": "content[0].content.text", "path": ["content", 0, "content", "text"],
                     "truncated": True, "reason": "disk_error", "bytes": 5000, "mediaType": TEXT_MEDIA_TYPE,
                     "lostBytes": 5000 - 100}
    assert "5000 bytes, truncated (disk_error)" in projected["content"][0]["content"]["text"]
    assert store.stats()["fallbacks"]["diskError"] == 1


def test_sidecar_projector_plugs_into_the_daemon_hook(make_store: StoreFactory) -> None:
    from hopline.daemon.projection import oversize_replacement
    from hopline.sidecars import sidecar_projector

    store = make_store()
    budget = store.budget.replace(sse_max_event_bytes=512 * 1024)
    projector = sidecar_projector(store, budget, then=oversize_replacement(budget))
    text = big_text(2 * MiB)
    projected = projector("daemon-s", tool_update(text))
    entry = projected["_meta"]["hopline.sidecar"][0]  # moved to a sidecar, not dropped by the SSE guard
    assert "hopline.dropped" not in projected["_meta"]
    stored = store.get("daemon-s", entry["id"])
    assert stored is not None and store.read_bytes(stored) == text.encode()
    # a huge message chunk goes to a sidecar too (S-4), not to the SSE guard
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "c" * MiB}}
    assert "hopline.dropped" not in projector("daemon-s", chunk)["_meta"]
    # what no sidecar can shrink (nothing but numbers) is still guarded by the next projector
    numbers = {"sessionUpdate": "x", **{f"k{i:06d}": i for i in range(60_000)}}
    assert len(orjson.dumps(numbers)) > 512 * 1024
    dropped = projector("daemon-s", numbers)["_meta"]["hopline.dropped"]
    assert dropped["lostBytes"] == len(orjson.dumps(numbers))
