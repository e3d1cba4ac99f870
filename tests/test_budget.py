from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from hopline.budget import (
    CEILINGS,
    CEILINGS_BY_KEY,
    COHERENCE_RULES,
    FIXED,
    HOP_MODELS,
    MAX_SIZE_BYTES,
    Budget,
    BudgetError,
    CoherenceFinding,
    IncoherentBudget,
    Unit,
    check_coherence,
    format_size,
    parse_size,
    require_coherent,
)
from hopline.budget.declare import unit_of
from hopline.budget.hops import ContextLimits, PipeLimits


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10mb", 10_485_760),
        ("8MiB", 8_388_608),
        ("256kb", 262_144),
        ("256KB", 262_144),
        ("256Kb", 262_144),
        ("  256kib  ", 262_144),
        ("1 gb", 1_073_741_824),
        ("1GiB", 1_073_741_824),
        ("2tb", 2 * 1024**4),
        ("1TiB", 1024**4),
        ("100b", 100),
        ("100B", 100),
        ("12345", 12_345),
        (" 42 ", 42),
        ("0", 0),
        ("0kb", 0),
        ("1.5kb", 1536),
        ("0.5b", 0),
        (7, 7),
    ],
)
def test_parse_size_accepts(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "   ", "-1", "-1kb", "ten", "10zb", "10 m b", "1e3", "0x10", "kb", "10mb10", "1,000", "+5"],
)
def test_parse_size_rejects_garbage_and_negatives(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_parse_size_overflow_boundary() -> None:
    assert parse_size(str(MAX_SIZE_BYTES)) == MAX_SIZE_BYTES
    with pytest.raises(ValueError, match="overflow"):
        parse_size(str(MAX_SIZE_BYTES + 1))
    with pytest.raises(ValueError, match="overflow"):
        parse_size("99999999999gb")
    with pytest.raises(ValueError):
        parse_size(True)  # type: ignore[arg-type]


def test_format_size() -> None:
    assert format_size(8 * 1024 * 1024) == "8 MiB"
    assert format_size(10 * 1024 * 1024) == "10 MiB"
    assert format_size(1536) == "1.50 KiB"
    assert format_size(12) == "12 B"


def test_each_setting_is_declared_once_typed_as_its_unit() -> None:
    """A key is a field of one hop's model only, its type says its unit, its default is of that
    type; every variable and every fixed value's name is one setting's."""
    owners: dict[str, str] = {}
    for model in HOP_MODELS:
        for key in model.model_fields:
            assert key not in owners, f"{key} is declared by {owners[key]} and {model.__name__}"
            owners[key] = model.__name__
    assert sorted(owners) == sorted(c.key for c in CEILINGS)
    assert set(Budget.model_fields) == set(owners)  # Budget gathers the models, no field of its own
    whole = {Unit.BYTES, Unit.COUNT, Unit.TOKENS}
    for c in (*CEILINGS, *FIXED):
        assert type(c.default) is (int if c.unit in whole else float), (c.key, c.default)
    for c in CEILINGS:
        assert unit_of(Budget.model_fields[c.key]) is c.unit and c.env is not None
    names = [c.name for c in (*CEILINGS, *FIXED)]
    assert len(names) == len(set(names)) == len(CEILINGS_BY_KEY)
    assert len({model.hop for model in HOP_MODELS}) == len(HOP_MODELS)


def test_a_fixed_value_is_a_constant_no_variable_changes() -> None:
    """COMPACTION_THRESHOLD reads as budget.compaction_threshold and as its model's constant; no
    variable moves it (its name, prefixed or not, is ignored); code may replace it."""
    assert ContextLimits.compaction_threshold == 0.7 == Budget.defaults().compaction_threshold
    env = {"COMPACTION_THRESHOLD": "0.5", "HOPLINE_COMPACTION_THRESHOLD": "0.5"}
    read = Budget.from_env(env)
    assert read.compaction_threshold == 0.7 and read.source("compaction_threshold") == "default"
    assert read.to_env() == {}
    replaced = Budget.defaults().replace(compaction_threshold=0.5)
    assert replaced.compaction_threshold == 0.5 and replaced.source("compaction_threshold") == "override"
    assert Budget.defaults().compaction_threshold == 0.7  # the defaults are not changed by a copy
    with pytest.raises(BudgetError, match="COMPACTION_THRESHOLD"):
        Budget.defaults().replace(compaction_threshold=0.99)  # over its bound (0.95)
    with pytest.raises(TypeError, match="no_such_key"):
        Budget.defaults().replace(no_such_key=1)


def test_a_hop_model_reads_its_own_variables() -> None:
    pipe = PipeLimits.from_env({"HOPLINE_PIPE_MAX_FRAME_BYTES": "1MiB", "API_JSON_BODY_LIMIT": "1"})
    assert pipe.pipe_max_frame_bytes == 1024 * 1024 and pipe.source("pipe_max_frame_bytes") == (
        "HOPLINE_PIPE_MAX_FRAME_BYTES")
    assert not hasattr(pipe, "api_json_body_limit")


def test_defaults_are_the_spec_table() -> None:
    b = Budget.defaults()
    assert b.api_json_body_limit == 10_485_760
    assert b.transport_max_body_bytes == 8_388_608
    assert b.context_window_tokens == 128_000
    assert b.compaction_threshold == 0.7
    assert b.bytes_per_token == 4
    assert b.tool_result_max_bytes == 32 * 1024
    assert b.gate_max_iterations == 60
    # 32 MiB, the official TypeScript SDK's ndJsonStream limit: a stock client takes every frame
    assert b.pipe_max_frame_bytes == b.agent_max_frame_bytes == 32 * 1024 * 1024
    assert (b.agent_silence_seconds, b.cancel_grace_seconds) == (600.0, 5.0)
    assert b.large_frame_threshold_bytes == 256 * 1024
    assert (b.large_frame_log_quota, b.large_frame_log_window_seconds) == (50, 60.0)
    assert b.client_sse_max_event_bytes == 16 * 1024 * 1024
    assert (b.sse_queue_max_events, b.sse_queue_max_bytes) == (256, 2 * 1024 * 1024)
    assert (b.ring_max_events, b.ring_max_bytes) == (8000, 8 * 1024 * 1024)
    assert (b.bulk_replay_max_updates, b.bulk_replay_max_bytes) == (10_000, 32 * 1024 * 1024)
    assert b.sidecar_threshold_bytes == 64 * 1024
    assert b.sidecar_max_object_bytes == 64 * 1024 * 1024
    assert b.sidecar_max_session_bytes == 256 * 1024 * 1024
    assert b.sidecar_max_store_bytes == 2 * 1024**3
    assert b.sidecar_ttl_seconds == 24 * 3600
    assert Budget.from_env({}) == b
    assert check_coherence(b) == []


def test_env_overrides_reach_the_table_with_their_source() -> None:
    b = Budget.from_env({"API_JSON_BODY_LIMIT": "100kb", "HOPLINE_BYTES_PER_TOKEN": " 3 "})
    assert b.api_json_body_limit == 100 * 1024
    assert b.source("api_json_body_limit") == "API_JSON_BODY_LIMIT"
    assert b.bytes_per_token == 3
    assert b.source("bytes_per_token") == "HOPLINE_BYTES_PER_TOKEN"
    assert b.source("transport_max_body_bytes") == "default"
    assert b.to_env() == {"API_JSON_BODY_LIMIT": "102400", "HOPLINE_BYTES_PER_TOKEN": "3"}
    assert Budget.from_env(b.to_env()) == b


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        ("HOPLINE_PIPE_MAX_FRAME_BYTES", "12zb", "unknown size unit"),
        ("API_JSON_BODY_LIMIT", "-1", "negative"),
        ("API_JSON_BODY_LIMIT", "0", "at least 1"),
        ("HOPLINE_BYTES_PER_TOKEN", "four", "whole number"),
        ("HOPLINE_SSE_QUEUE_MAX_EVENTS", "4096", "at most 2048"),
        ("HOPLINE_COMMAND_TIMEOUT", "nan", "finite"),
    ],
)
def test_bad_value_names_the_variable_and_value(var: str, value: str, needle: str) -> None:
    with pytest.raises(BudgetError) as info:
        Budget.from_env({var: value})
    assert var in str(info.value)
    assert repr(value) in str(info.value)
    assert needle in str(info.value)


def test_replace_validates_and_marks_override() -> None:
    b = Budget.defaults().replace(transport_max_body_bytes=256 * 1024)
    assert b.source("transport_max_body_bytes") == "override"
    with pytest.raises(BudgetError):
        Budget.defaults().replace(transport_max_body_bytes=0)


def _with(**changes: int | float) -> Budget:
    return Budget.defaults().replace(**changes)


def _found(rule: str, budget: Budget) -> list[CoherenceFinding]:
    """The findings of one coherence rule (a model validator of Budget) on ``budget``."""
    assert rule in COHERENCE_RULES
    return [f for f in budget.findings if f.rule == rule]


def test_engine_within_gateway_at_the_boundary_and_over() -> None:
    assert _found("engine_within_gateway", _with(transport_max_body_bytes=10 * 1024 * 1024)) == []
    [f] = _found("engine_within_gateway", _with(transport_max_body_bytes=10 * 1024 * 1024 + 1))
    assert f.severity == "error"


def test_the_seeds_incoherent_chain_names_both_variables() -> None:
    b = Budget.from_env({"HOPLINE_TRANSPORT_MAX_BODY_BYTES": "12mb", "API_JSON_BODY_LIMIT": "10mb"})
    errors = [f for f in check_coherence(b) if f.severity == "error"]
    assert [f.rule for f in errors] == ["engine_within_gateway"]
    assert errors[0].settings == ("HOPLINE_TRANSPORT_MAX_BODY_BYTES", "API_JSON_BODY_LIMIT")
    assert "HOPLINE_TRANSPORT_MAX_BODY_BYTES" in errors[0].message
    assert "API_JSON_BODY_LIMIT" in errors[0].message
    with pytest.raises(IncoherentBudget):
        require_coherent(b)


def test_sse_event_within_client_reader() -> None:
    limit = 16 * 1024 * 1024
    assert _found("sse_event_within_client_reader", _with(sse_max_event_bytes=limit)) == []
    [f] = _found("sse_event_within_client_reader", _with(sse_max_event_bytes=limit + 1))
    assert f.severity == "error"
    assert set(f.settings) == {"HOPLINE_SSE_MAX_EVENT_BYTES", "HOPLINE_CLIENT_SSE_MAX_EVENT_BYTES"}


def test_iteration_fits_engine_is_a_warning() -> None:
    # room above the trigger: 30 % of 8 MiB = 2,516,582 bytes; 8 x (32 KiB + args)
    room = int(8 * 1024 * 1024 * 0.3)
    fits = room // 8 - 32 * 1024
    assert _found("iteration_fits_engine", _with(tool_arguments_max_bytes=fits)) == []
    [f] = _found("iteration_fits_engine", _with(tool_arguments_max_bytes=fits + 1))
    assert f.severity == "warning"
    assert "HOPLINE_TOOL_ARGUMENTS_MAX_BYTES" in f.settings
    assert require_coherent(_with(tool_arguments_max_bytes=fits + 1)) == [f]


def test_summarization_fits_engine() -> None:
    ceiling = 8 * 1024 * 1024
    ok = ceiling - 64 * 1024
    assert _found("summarization_fits_engine", _with(summary_chunk_bytes=ok)) == []
    [f] = _found("summarization_fits_engine", _with(summary_chunk_bytes=ok + 1))
    assert f.severity == "error"


def test_pipe_ends_agree() -> None:
    assert _found("pipe_ends_agree", Budget.from_env({"HOPLINE_PIPE_MAX_FRAME_BYTES": "32MiB"})) == []
    [f] = _found("pipe_ends_agree", Budget.from_env({"HOPLINE_AGENT_MAX_FRAME_BYTES": "50MiB"}))
    assert f.severity == "error"
    assert f.settings == ("HOPLINE_PIPE_MAX_FRAME_BYTES", "HOPLINE_AGENT_MAX_FRAME_BYTES")


def test_sidecar_rules() -> None:
    store = 2 * 1024**3
    assert _found("sidecar_quotas_nested", _with(sidecar_max_session_bytes=store)) == []
    [f] = _found("sidecar_quotas_nested", _with(sidecar_max_session_bytes=store + 1))
    assert f.severity == "error"
    large = 256 * 1024
    assert _found("sidecar_under_large_frame", _with(sidecar_threshold_bytes=large - 1)) == []
    [w] = _found("sidecar_under_large_frame", _with(sidecar_threshold_bytes=large))
    assert w.severity == "warning"
    sse = 16 * 1024 * 1024
    assert _found("sidecar_stub_within_sse_event", _with(sidecar_threshold_bytes=sse - 1)) == []
    [e] = _found("sidecar_stub_within_sse_event", _with(sidecar_threshold_bytes=sse))
    assert e.severity == "error"


def test_sse_queue_holds_four_of_the_largest_inline_events() -> None:
    threshold = 12 * 1024 * 1024  # the relay bench's: whole 8 MiB frames cross every hop
    rule = "sse_queue_holds_largest_events"
    assert _found(rule, _with(sidecar_threshold_bytes=threshold, sse_queue_max_bytes=4 * threshold)) == []
    [w] = _found(rule, _with(sidecar_threshold_bytes=threshold, sse_queue_max_bytes=4 * threshold - 1))
    assert w.severity == "warning"
    assert w.settings == ("HOPLINE_SSE_QUEUE_MAX_BYTES", "HOPLINE_SIDECAR_THRESHOLD_BYTES")
    assert str(4 * threshold - 1) in w.message and str(threshold) in w.message


def test_serve_says_a_coherence_warning_at_start_up(tmp_path: Path) -> None:
    """The warning reaches the operator of `hopline serve` (stderr), not only `hopline limits`."""
    env = {"HOPLINE_SIDECAR_THRESHOLD_BYTES": "128KiB", "HOPLINE_SSE_QUEUE_MAX_BYTES": "511KiB"}
    # A bad --agent-env name stops it right after the budget is read (exit 2, nothing bound).
    proc = _hopline("serve", "--data-dir", str(tmp_path), "--agent-env", "BAD=NAME", env=env)
    assert proc.returncode == 2 and "bad setting" in proc.stderr
    assert "hopline serve: warning sse_queue_holds_largest_events:" in proc.stderr
    coherent = _hopline("serve", "--data-dir", str(tmp_path), "--agent-env", "BAD=NAME",
                        env={**env, "HOPLINE_SSE_QUEUE_MAX_BYTES": "512KiB"})
    assert coherent.returncode == 2 and "warning" not in coherent.stderr


def test_stream_carries_response() -> None:
    response = 10 * 1024 * 1024
    assert _found("stream_carries_response", _with(provider_stream_max_bytes=response)) == []
    [f] = _found("stream_carries_response", _with(provider_stream_max_bytes=response - 1))
    assert f.severity == "error"
    assert f.settings == ("HOPLINE_PROVIDER_RESPONSE_MAX_BYTES", "HOPLINE_PROVIDER_STREAM_MAX_BYTES")


def test_provider_and_plan_rows() -> None:
    b = Budget.defaults()
    assert b.provider_stream_max_bytes == 64 * 1024 * 1024 and b.plan_max_entries == 16
    assert b.model_context_window_tokens == 128_000 and b.source("model_context_window_tokens") == "default"
    set_ = Budget.from_env({"HOPLINE_MODEL_CONTEXT_WINDOW": "32000", "HOPLINE_PLAN_MAX_ENTRIES": "2"})
    assert set_.model_context_window_tokens == 32_000
    assert set_.source("model_context_window_tokens") == "HOPLINE_MODEL_CONTEXT_WINDOW"
    with pytest.raises(BudgetError, match="HOPLINE_PLAN_MAX_ENTRIES"):
        Budget.from_env({"HOPLINE_PLAN_MAX_ENTRIES": "1"})


def test_every_rule_runs_as_the_budget_is_built() -> None:
    assert len(COHERENCE_RULES) == 10 and Budget.defaults().findings == []
    incoherent = Budget.from_env({"HOPLINE_AGENT_MAX_FRAME_BYTES": "50MiB"})
    assert [f.rule for f in incoherent.findings] == ["pipe_ends_agree"]
    assert check_coherence(incoherent) == incoherent.findings


def _hopline(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HOPLINE_", "API_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hopline", *args], capture_output=True, text=True, env=full_env,
        timeout=60,
    )


@pytest.mark.e2e
def test_limits_cli_on_defaults() -> None:
    table = _hopline("limits")
    assert table.returncode == 0, table.stderr
    assert "API_JSON_BODY_LIMIT" in table.stdout
    assert "narrowest on the request path" in table.stdout
    as_json = _hopline("limits", "--json")
    assert as_json.returncode == 0
    doc = orjson.loads(as_json.stdout)
    by_name = {row["name"]: row for row in doc["ceilings"]}
    assert by_name["API_JSON_BODY_LIMIT"]["bytes"] == 10_485_760
    assert by_name["HOPLINE_TRANSPORT_MAX_BODY_BYTES"]["bytes"] == 8_388_608
    assert by_name["API_JSON_BODY_LIMIT"]["source"] == "default"
    assert "COMPACTION_THRESHOLD" not in by_name
    fixed = {row["name"]: row for row in doc["fixed"]}
    assert fixed["COMPACTION_THRESHOLD"] == {"name": "COMPACTION_THRESHOLD", "hop": "harness.context",
                                             "value": 0.7, "unit": "ratio"}
    assert doc["narrowestRequestCeiling"] == "HOPLINE_TRANSPORT_MAX_BODY_BYTES"
    assert doc["errors"] == [] and doc["warnings"] == []


@pytest.mark.e2e
def test_limits_cli_incoherent_exits_1_naming_both() -> None:
    env = {"HOPLINE_TRANSPORT_MAX_BODY_BYTES": "12mb", "API_JSON_BODY_LIMIT": "10mb"}
    result = _hopline("limits", "--json", env=env)
    assert result.returncode == 1
    doc = orjson.loads(result.stdout)
    [error] = doc["errors"]
    assert set(error["settings"]) == {"HOPLINE_TRANSPORT_MAX_BODY_BYTES", "API_JSON_BODY_LIMIT"}
    by_name = {row["name"]: row for row in doc["ceilings"]}
    assert by_name["HOPLINE_TRANSPORT_MAX_BODY_BYTES"]["source"] == "HOPLINE_TRANSPORT_MAX_BODY_BYTES"
    assert _hopline("limits", env=env).returncode == 1


@pytest.mark.e2e
def test_limits_cli_marks_the_narrowest_when_the_gateway_is_narrower() -> None:
    result = _hopline("limits", "--json", env={"API_JSON_BODY_LIMIT": "100kb"})
    assert result.returncode == 1
    assert orjson.loads(result.stdout)["narrowestRequestCeiling"] == "API_JSON_BODY_LIMIT"


@pytest.mark.e2e
def test_limits_cli_bad_value_fails_at_startup() -> None:
    result = _hopline("limits", env={"HOPLINE_PIPE_MAX_FRAME_BYTES": "64 megs"})
    assert result.returncode == 2
    assert "HOPLINE_PIPE_MAX_FRAME_BYTES" in result.stderr
    assert "'64 megs'" in result.stderr
