from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hopline.harness.context import (
    CUT_BETWEEN_GROUPS,
    INTERRUPTED_TEXT,
    SUMMARY_MARKER,
    SYSTEM_KEPT,
    TASK_KEPT,
    Bounds,
    CompactionPlan,
    apply_compaction,
    compaction_violations,
    effective_window,
    group_by_iteration,
    plan_compaction,
    repair,
    violations,
    walk_calls,
)
from hopline.harness.summarize import extractive_summary
from hopline.harness.tokens import body_bytes_for, estimate

ENVELOPE = len(b'{"messages":[],"purpose":"turn"}')


def test_effective_window_and_trigger_kind() -> None:
    assert effective_window(128_000, 8 * 1024 * 1024, 4) == 128_000
    assert effective_window(4_000_000, 8 * 1024 * 1024, 4) == 2 * 1024 * 1024
    model = Bounds(128_000, 8 * 1024 * 1024, 4, 0.7)
    assert model.trigger_kind == "model" and model.trigger_tokens == 89_600
    transport = Bounds(4_000_000, 8 * 1024 * 1024, 4, 0.7)
    assert transport.trigger_kind == "transport"
    assert transport.trigger_tokens == int(0.7 * 2 * 1024 * 1024)
    small = Bounds(128_000, 256 * 1024, 4, 0.7)
    assert small.trigger_kind == "transport" and small.effective_window == 65_536
    # the exact body also triggers, even under the token trigger
    assert small.should_compact(10, int(0.7 * 256 * 1024) + 1)
    assert not small.should_compact(10, int(0.7 * 256 * 1024))


def iteration(k: int, n_calls: int, result_bytes: int, args_bytes: int = 10) -> list[dict]:
    calls = [{"id": f"c{k}_{j}", "type": "function",
              "function": {"name": "read_file",
                           "arguments": orjson.dumps({"path": "a" * args_bytes}).decode()}}
             for j in range(n_calls)]
    out: list[dict] = [{"role": "assistant", "content": "", "tool_calls": calls}]
    out += [{"role": "tool", "tool_call_id": c["id"], "content": "r" * result_bytes} for c in calls]
    return out


def test_group_by_iteration_keeps_calls_with_results() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "t"},
                *iteration(1, 3, 5), {"role": "user", "content": "more"}, *iteration(2, 1, 5),
                {"role": "assistant", "content": "done"}]
    kinds = [(g.kind, len(g)) for g in group_by_iteration(messages)]
    assert kinds == [("system", 1), ("task", 1), ("iteration", 4), ("message", 1), ("iteration", 2),
                     ("message", 1)]


def test_repair_removes_orphans_and_answers_unanswered_calls() -> None:
    it = iteration(1, 3, 5)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "t"},
                {"role": "tool", "tool_call_id": "ghost", "content": "orphan"},
                it[0], it[1], it[1],  # c1_0 answered twice, c1_1 and c1_2 never
                {"role": "user", "content": "next"},
                {"role": "tool", "tool_call_id": "c1_2", "content": "late, after a user message"}]
    assert violations(messages)
    fixed, report = repair(messages)
    assert report.orphan_results_removed == 3
    assert report.interrupted_results_added == 2
    assert violations(fixed) == []
    assert [m.get("content") for m in fixed if m.get("role") == "tool"] == ["r" * 5, INTERRUPTED_TEXT,
                                                                             INTERRUPTED_TEXT]
    again, report2 = repair(fixed)
    assert again == fixed and report2.total == 0


def test_compaction_replaces_oldest_groups_with_one_counted_summary() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "the task"}]
    for k in range(20):
        messages += iteration(k, 3, 2000)
    sizes = [len(orjson.dumps(m)) for m in messages]
    before = body_bytes_for(ENVELOPE, sizes)
    plan = plan_compaction(messages, target_tokens=10_000, target_body_bytes=40_000, bytes_per_token=4,
                           envelope_bytes=ENVELOPE, summary_max_bytes=4096)
    assert plan.possible and plan.reason == ""
    summary = extractive_summary(plan.old, plan.summary_max_bytes)
    result, record = apply_compaction(plan, summary, summarizer="extractive", trigger="model",
                                      envelope_bytes=ENVELOPE, target_body_bytes=40_000)
    assert result[0]["content"] == "sys" and result[1]["content"] == "the task"
    assert result[2]["content"].startswith(SUMMARY_MARKER)
    assert sum(1 for m in result if SUMMARY_MARKER in str(m.get("content"))) == 1
    assert f"replaces {record.messages_replaced} earlier messages ({record.bytes_replaced} bytes)" in \
        result[2]["content"]
    assert record.messages_replaced == len(plan.old)
    assert record.bytes_before == before
    assert record.bytes_after == body_bytes_for(ENVELOPE, [len(orjson.dumps(m)) for m in result])
    assert record.bytes_after <= 40_000 and estimate(result) <= 10_000
    assert violations(result) == []
    assert result[-1] is messages[-1]


def test_compaction_reports_when_newest_group_is_too_large() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                *iteration(1, 1, 100), *iteration(2, 4, 30_000)]
    plan = plan_compaction(messages, target_tokens=5000, target_body_bytes=20_000, bytes_per_token=4,
                           envelope_bytes=ENVELOPE, summary_max_bytes=4096)
    assert "newest iteration alone" in plan.reason
    assert plan.tail[0]["role"] == "assistant" and len(plan.tail) == 5


# --- property tests ------------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": draw(st.text(max_size=50))},
                            {"role": "user", "content": draw(st.text(min_size=1, max_size=50))}]
    n_iter = draw(st.integers(0, 12))
    for k in range(n_iter):
        if draw(st.booleans()):
            messages.append({"role": "user", "content": draw(st.text(max_size=30))})
        n_calls = draw(st.integers(0, 4))
        if n_calls == 0:
            messages.append({"role": "assistant", "content": draw(st.text(max_size=40))})
            continue
        arg_size = draw(st.sampled_from([0, 10, 3000, 40_000]))
        calls = [{"id": f"c{k}_{j}", "type": "function",
                  "function": {"name": "write_file",
                               "arguments": orjson.dumps({"c": "a" * arg_size}).decode()}}
                 for j in range(n_calls)]
        messages.append({"role": "assistant", "content": draw(st.sampled_from(["", None, "thinking"])),
                         "tool_calls": calls})
        for c in calls:
            size = draw(st.sampled_from([0, 5, 2000, 32 * 1024]))
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "r" * size})
        if draw(st.integers(0, 5)) == 0:  # a stray result now and then: repair must catch it
            messages.append({"role": "tool", "tool_call_id": "stray", "content": "x"})
        if draw(st.integers(0, 5)) == 0:
            messages.insert(draw(st.integers(2, len(messages))),
                            {"role": "user", "content": "interleaved"})
    return messages


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.sampled_from([2_000, 20_000, 100_000]))
def test_property_compaction_keeps_protocol_and_lands_under_target_or_says_why(
        raw: list[dict], target_body: int) -> None:
    messages, _ = repair(raw)
    assert violations(messages) == []
    target_tokens = target_body // 4
    plan = plan_compaction(messages, target_tokens=target_tokens, target_body_bytes=target_body,
                           bytes_per_token=4, envelope_bytes=ENVELOPE, summary_max_bytes=16 * 1024)
    if not plan.possible:
        assert plan.reason
        return
    summary = extractive_summary(plan.old, plan.summary_max_bytes)
    result, record = apply_compaction(plan, summary, summarizer="extractive", trigger="model",
                                      envelope_bytes=ENVELOPE, target_body_bytes=target_body)
    # never separates a tool result from its call
    assert violations(result) == []
    # keeps the system prompt and the task
    assert result[0] is messages[0] and result[1] is messages[1]
    # the cut falls between groups: old + tail are whole groups of the original
    starts = {g.start for g in group_by_iteration(messages)}
    assert len(plan.head) + len(plan.old) + len(plan.pinned) in starts
    assert len(plan.pinned) <= 1 and all(m["role"] == "user" for m in plan.pinned)
    assert len(plan.head) in starts
    assert compaction_violations(messages, plan) == []  # what plan_compaction itself enforces
    # lands under the target or says why
    assert (record.bytes_after <= target_body and estimate(result) <= target_tokens) or record.reason
    assert record.messages_replaced == len(plan.old) > 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.sampled_from(["a", "b", "c"]),
                           "content": st.text(max_size=5)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.just(""),
                           "tool_calls": st.lists(st.fixed_dictionaries({
                               "id": st.sampled_from(["a", "b", "c"]), "type": st.just("function"),
                               "function": st.just({"name": "f", "arguments": "{}"})}), min_size=1,
                               max_size=3)}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                           "content": st.text(max_size=5)}),
), max_size=20))
def test_property_repair_always_yields_valid_history(raw: list[dict]) -> None:
    fixed, report = repair(raw)
    assert violations(fixed) == []
    tools_before = sum(1 for m in raw if m["role"] == "tool")
    tools_after = sum(1 for m in fixed if m["role"] == "tool")
    assert tools_after == tools_before - report.orphan_results_removed + report.interrupted_results_added


def test_latest_prompt_of_a_later_turn_survives_compaction() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "first task"}]
    for k in range(5):
        messages += iteration(k, 2, 3000)
    messages.append({"role": "user", "content": "second prompt"})
    for k in range(5, 12):
        messages += iteration(k, 2, 3000)
    plan = plan_compaction(messages, target_tokens=4000, target_body_bytes=16_000, bytes_per_token=4,
                           envelope_bytes=ENVELOPE, summary_max_bytes=2048)
    assert plan.pinned == [{"role": "user", "content": "second prompt"}]
    result, record = apply_compaction(plan, "s", summarizer="extractive", trigger="model",
                                      envelope_bytes=ENVELOPE, target_body_bytes=16_000)
    assert [m["content"] for m in result[:4]][1:] == ["first task", result[2]["content"], "second prompt"]
    assert result[2]["content"].startswith(SUMMARY_MARKER)
    assert violations(result) == [] and record.bytes_after <= 16_000
    assert record.messages_replaced == len(plan.old) and "second prompt" not in str(plan.old)


def test_one_walker_reads_every_call_and_its_run_of_results() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": ""}},
        {"id": "b", "function": {"name": "f", "arguments": ""}}]}
    messages = [{"role": "tool", "tool_call_id": "x", "content": ""},  # 0: before any call
                call,                                                  # 1
                {"role": "tool", "tool_call_id": "a", "content": ""},  # 2: answers a
                {"role": "tool", "tool_call_id": "a", "content": ""},  # 3: a again
                {"role": "tool", "tool_call_id": "z", "content": ""},  # 4: answers nothing
                {"role": "user", "content": "u"}]                      # 5
    segments = walk_calls(messages)
    assert [(s.index, s.orphan) for s in segments] == [(0, True), (1, False), (5, False)]
    assert segments[1].results == ((2, "answer"), (3, "duplicate"), (4, "stray"))
    assert segments[1].calls == ("a", "b") and segments[1].missing == ("b",)
    # the three readers agree with the walk
    assert [(g.start, g.end, g.kind) for g in group_by_iteration(messages)] == [
        (0, 1, "orphan"), (1, 4, "iteration"), (4, 5, "orphan"), (5, 6, "task")]
    assert violations(messages) == [("TOOL_RESULT_FOLLOWS_CALL", 0), ("NO_DUPLICATE_RESULT", 3),
                                    ("TOOL_RESULT_FOLLOWS_CALL", 4), ("CALL_HAS_RESULT", 1)]
    fixed, report = repair(messages)
    assert [m.get("tool_call_id") for m in fixed] == [None, "a", "b", None]
    assert (report.orphan_results_removed, report.interrupted_results_added) == (3, 1)


def test_compaction_invariants_are_checked_on_a_plan() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                *iteration(1, 2, 10), *iteration(2, 1, 10)]
    good = CompactionPlan(messages[:2], messages[2:5], messages[5:], 64)
    assert compaction_violations(messages, good) == []
    inside_a_group = CompactionPlan(messages[:2], messages[2:4], messages[4:], 64)  # splits iteration 1
    assert compaction_violations(messages, inside_a_group) == [CUT_BETWEEN_GROUPS]
    without_head = CompactionPlan([], messages[:5], messages[5:], 64)
    assert compaction_violations(messages, without_head) == [SYSTEM_KEPT, TASK_KEPT]
