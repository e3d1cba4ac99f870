"""Session store (real SQLite file) and the pure bulk-replay pager."""

from __future__ import annotations

from pathlib import Path

import orjson

from hopline.harness.sessions import (
    SessionStore,
    array_bytes,
    default_data_dir,
    join_array,
    page_updates,
)


def test_store_round_trip_survives_reopen(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    record = store.create("qa_automation", "/w", {"permissionMode": "auto", "scripted": {"x": 1}})
    updates = [{"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": f"t{i}é"}}
               for i in range(5)]
    bodies = [store.append_update(record.id, u) for u in updates]
    store.save_conversation(record.id, [{"role": "user", "content": "hi"}])
    store.close()

    again = SessionStore(tmp_path)
    loaded = again.get(record.id)
    assert loaded.profile == "qa_automation" and loaded.cwd == "/w"
    assert loaded.options == {"permissionMode": "auto", "scripted": {"x": 1}}
    assert loaded.conversation == [{"role": "user", "content": "hi"}]
    assert again.read_updates(record.id) == bodies
    assert [orjson.loads(b) for b in again.read_updates(record.id, 2, 2)] == updates[2:4]
    assert again.update_count(record.id) == 5
    again.close()


def test_default_data_dir_prefers_env(tmp_path: Path) -> None:
    assert default_data_dir({"HOPLINE_DATA_DIR": str(tmp_path)}) == tmp_path
    assert default_data_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "hopline"


def _items(sizes: list[int]) -> list[bytes]:
    return [orjson.dumps("x" * (n - 2)) for n in sizes]  # a JSON string of n bytes


def test_page_fits_exactly_at_the_byte_limit_and_not_one_over() -> None:
    items = _items([10, 10, 10])
    envelope = 7
    exact = envelope + array_bytes(items)  # all three fit exactly
    page = page_updates(items, 0, max_updates=100, max_bytes=exact, envelope_bytes=envelope)
    assert (page.count, page.has_more) == (3, False)
    assert page.encoded_bytes == len(join_array(items))
    page = page_updates(items, 0, max_updates=100, max_bytes=exact - 1, envelope_bytes=envelope)
    assert (page.count, page.has_more) == (2, True)
    assert envelope + page.encoded_bytes <= exact - 1


def test_page_respects_the_update_count() -> None:
    items = _items([4] * 12)
    page = page_updates(items, 0, max_updates=5, max_bytes=10**6, envelope_bytes=0, total=12)
    assert (page.count, page.has_more, page.next_start) == (5, True, 5)
    page = page_updates(items[10:], 10, max_updates=5, max_bytes=10**6, envelope_bytes=0, total=12)
    assert (page.count, page.has_more) == (2, False)


def test_an_update_larger_than_the_limit_goes_alone_never_dropped() -> None:
    items = _items([100, 5])
    page = page_updates(items, 0, max_updates=10, max_bytes=50, envelope_bytes=10, total=2)
    assert (page.count, page.oversized, page.has_more) == (1, True, True)
    page = page_updates(items[1:], 1, max_updates=10, max_bytes=50, envelope_bytes=10, total=2)
    assert (page.count, page.oversized, page.has_more) == (1, False, False)


def test_empty_log_is_one_empty_page() -> None:
    page = page_updates([], 0, max_updates=10, max_bytes=100, envelope_bytes=10, total=0)
    assert (page.count, page.has_more) == (0, False)
