"""Sidecar stubs keep shapes (issue 28): projection moves only large fields (strings, arrays,
objects over the preview row), numbers, booleans and nulls never move by themselves, and
``_meta["hopline.sidecar"]`` restores the update exactly. A property test over arbitrary updates,
against an in-memory sink (the projection is pure over its sink)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from hopline.budget import Budget
from hopline.sidecars.entry import SidecarEntry
from hopline.sidecars.projection import JsonPath, project_fields, restore_update, value_at

BUDGET = Budget.defaults().replace(sidecar_threshold_bytes=400, sidecar_preview_bytes=48)


class MemorySink:
    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}

    def put(self, data: bytes, media_type: str) -> SidecarEntry:
        sidecar_id = hashlib.sha256(data + media_type.encode()).hexdigest()[:32]
        self.bodies[sidecar_id] = data
        digest = hashlib.sha256(data).hexdigest()
        return SidecarEntry(sidecar_id, "s1", len(data), digest, media_type, 0.0, 0.0)

    def count_fallback(self, reason: str) -> None:
        pass

    def count_kept_off_wire(self, nbytes: int) -> None:
        pass


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=600)
values = st.recursive(st.one_of(scalars, texts),
                      lambda inner: st.one_of(st.lists(inner, max_size=6),
                                              st.dictionaries(st.text(max_size=6), inner, max_size=6)),
                      max_leaves=30)
# the fields the kinds name (S-4) among arbitrary ones
keys = st.one_of(st.sampled_from(["rawOutput", "content", "entries", "availableCommands"]),
                 st.text(min_size=1, max_size=6).filter(lambda k: k not in ("sessionUpdate", "_meta")))
updates = st.builds(lambda kind, fields: {"sessionUpdate": kind, **fields},
                    st.sampled_from(["tool_call_update", "agent_message_chunk", "plan", "odd_kind"]),
                    st.dictionaries(keys, values, max_size=6))


def _scalars(node: Any, path: JsonPath = ()) -> list[tuple[JsonPath, Any]]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _scalars(v, (*path, k))]
    if isinstance(node, list):
        return [s for i, v in enumerate(node) for s in _scalars(v, (*path, i))]
    return [] if isinstance(node, str) else [(path, node)]


@settings(max_examples=300, deadline=None)
@given(updates)
def test_projection_moves_only_large_fields_and_restores_exactly(update: dict[str, Any]) -> None:
    sink = MemorySink()
    projection = project_fields(update, sink, BUDGET)
    projected = projection.update
    entries = projected.get("_meta", {}).get("hopline.sidecar", []) if projected is not update else []
    moved = [tuple(e["path"]) for e in entries]
    for path in moved:
        original = value_at(update, path)
        assert isinstance(original, (str, list, dict))  # never a number, boolean or null by itself
        assert len(orjson.dumps(original)) > BUDGET.sidecar_preview_bytes  # only large fields move
    for path, value in _scalars(update):  # every scalar not inside a moved field is where it was
        if not any(path[:len(m)] == m for m in moved):
            assert value_at(projected, path) == value
    assert restore_update(projected, lambda e: sink.bodies[e["id"]]) == update


def test_exit_code_stays_beside_a_moved_output() -> None:
    sink = MemorySink()
    update = {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed",
              "rawOutput": {"output": "o" * 5000, "exitCode": 0, "truncated": False, "error": None}}
    projected = project_fields(update, sink, BUDGET).update
    assert projected["rawOutput"]["exitCode"] == 0
    assert projected["rawOutput"]["truncated"] is False and projected["rawOutput"]["error"] is None
    assert [e["path"] for e in projected["_meta"]["hopline.sidecar"]] == [["rawOutput", "output"]]
    assert restore_update(projected, lambda e: sink.bodies[e["id"]]) == update
