"""S-3 meets S-1: an update our agent already stubbed passes the daemon's projection unchanged.

Real SQLite stores in tmp dirs; the agent side writes through a real :class:`SidecarWriter` bound
by a minted token to the daemon's session, exactly as under the daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hopline.budget import Budget
from hopline.harness.acp.messages import tool_result_update_of
from hopline.harness.acp.sidecars import offload_update
from hopline.harness.loop_events import ToolCallFinished
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.store_projection import project_message, project_update
from hopline.sidecars.writer import SidecarWriter
from hopline.vocabulary import META_SIDECAR

SESSION = "daemon-session-1"
BUDGET = Budget.defaults()


def big(tag: str, size: int) -> str:
    line = f"{tag} ERROR timeout é→ ✓ {'y' * 50}\n"
    return (line * (size // len(line.encode()) + 1))[:size]


def full_update(text: str, raw_output: Any = None) -> dict[str, Any]:
    event = ToolCallFinished("call_1_2_0", "completed", text, text[:200], raw_output)
    return tool_result_update_of(event, "run_command")


@pytest.fixture
def store(make_store: Callable[..., SidecarStore]) -> SidecarStore:
    return make_store(BUDGET)


@pytest.fixture
def writer(store: SidecarStore) -> Iterator[SidecarWriter]:
    # The agent's own connection to the daemon's store root, like a child process has.
    opened = SidecarWriter(SidecarStore(store.root, BUDGET), store.mint_write_token(SESSION))
    yield opened
    opened.close()


def notification(update: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": "agent-side", "update": update}}


def test_stubbed_update_passes_the_projection_unchanged(store: SidecarStore, writer: SidecarWriter) -> None:
    stubbed = offload_update(full_update(big("a", 200 * 1024)), writer, BUDGET)
    assert len(stubbed["_meta"][META_SIDECAR]) == 1
    before = store.stats()
    assert project_update(stubbed, SESSION, store, BUDGET) is stubbed
    message = notification(stubbed)
    assert project_message(message, SESSION, store, BUDGET) is message
    assert store.stats()["count"] == before["count"]  # nothing stored twice


def test_structured_and_string_raw_output_stubs_pass_unchanged(store: SidecarStore,
                                                               writer: SidecarWriter) -> None:
    text = big("b", BUDGET.sidecar_threshold_bytes + 1)
    stubbed = offload_update({**full_update(text), "rawOutput": text}, writer, BUDGET)
    fields = sorted(e["field"] for e in stubbed["_meta"][META_SIDECAR])
    assert fields == ["content[0].content.text", "rawOutput"]
    assert project_update(stubbed, SESSION, store, BUDGET) is stubbed

    structured = {"chunks": [text[:4096]] * 20}
    stubbed = offload_update(full_update("ok", structured), writer, BUDGET)
    # the object stays an object: its large array moved (still an array on the wire, its leading
    # items that fit the preview kept: none of 4 KiB each), nothing else
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry["path"] == ["rawOutput", "chunks"] and entry["items"] == 20
    assert stubbed["rawOutput"] == {"chunks": []}
    assert project_update(stubbed, SESSION, store, BUDGET) is stubbed


def test_truncated_fallback_stub_passes_unchanged(store: SidecarStore) -> None:
    small = BUDGET.replace(sidecar_max_object_bytes=1024)
    token = store.mint_write_token(SESSION)
    quota_writer = SidecarWriter(SidecarStore(store.root, small), token)
    try:
        stubbed = offload_update(full_update(big("c", 100 * 1024)), quota_writer, small)
    finally:
        quota_writer.close()
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry["truncated"] is True and entry["reason"] == "over_object_quota"
    # The daemon (default quotas) does not retry: the body is not in the update any more.
    assert project_update(stubbed, SESSION, store, BUDGET) is stubbed


def test_agent_stub_equals_the_daemon_projection_of_the_full_update(store: SidecarStore,
                                                                    writer: SidecarWriter) -> None:
    """One format for clients: the agent's stub is what the daemon would have made (same sidecar)."""
    update = full_update(big("d", 150 * 1024))
    from_agent = offload_update(update, writer, BUDGET)
    from_daemon = project_update(update, SESSION, store, BUDGET)
    assert from_daemon == from_agent
    assert store.stats()["count"] == 1  # the daemon found the agent's sidecar (same bytes, same session)


def test_projection_keeps_agent_entries_when_it_moves_another_field(store: SidecarStore,
                                                                    writer: SidecarWriter) -> None:
    stubbed = offload_update(full_update(big("e", 100 * 1024)), writer, BUDGET)
    agent_entry = stubbed["_meta"][META_SIDECAR][0]
    # A field over the threshold the agent did not move (e.g. added by a relay): the daemon moves it
    # and appends its entry after the agent's.
    extra = big("f", BUDGET.sidecar_threshold_bytes + 1)
    mixed = {**stubbed, "content": [*stubbed["content"],
                                    {"type": "content", "content": {"type": "text", "text": extra}}]}
    projected = project_update(mixed, SESSION, store, BUDGET)
    entries = projected["_meta"][META_SIDECAR]
    assert entries[0] == agent_entry
    assert [e["field"] for e in entries] == ["content[0].content.text", "content[1].content.text"]
    assert entries[1]["path"] == ["content", 1, "content", "text"]
    assert projected["_meta"]["hopline.tool"] == {"name": "run_command", "provenance": "builtin"}
