"""Fuzz as CI (SPEC D-10): schemathesis over the live daemon's /openapi.json, every operation, positive
and negative cases, plus a hypothesis strategy that puts lone UTF-16 surrogates into every JSON body
field (schemathesis, like hypothesis' text(), never generates them: no UTF-8 string can hold one).

Every answer must be below 500, and every 4xx must have hopline's error shape naming its hop. One
daemon for the module; every session a case creates is deleted by the test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from .support import Daemon, running_daemon

pytestmark = pytest.mark.e2e  # every test here starts real processes

EXAMPLES = 12
SPAWNING_EXAMPLES = 5  # POST /session starts a real agent process per accepted case
SURROGATE_EXAMPLES = 15
HOPS = {"daemon.api", "daemon.sse", "daemon.sidecars", "daemon.gate", "gateway.llm_turn"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("fuzz")) as d:
        yield d


@pytest.fixture(scope="module")
def real_session(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    cwd = tmp_path_factory.mktemp("fuzz-cwd")
    session = httpx.post(daemon.url + "/session", json={"cwd": str(cwd)}, headers=daemon.headers, timeout=30)
    assert session.status_code == 200
    return str(session.json()["sessionId"])


def shape_problem(status: int, content: bytes) -> str | None:
    """Why this answer breaks the contract (a 5xx, or a 4xx without hopline's error shape), or None."""
    if status >= 500:
        return f"{status}: {content[:200]!r}"
    if status < 400:
        return None
    try:
        error = orjson.loads(content)["error"]
        assert isinstance(error["type"], str) and isinstance(error["message"], str) and error["hop"] in HOPS
    except Exception:
        return f"{status} without hopline's error shape: {content[:200]!r}"
    return None


def forget_created(daemon: Daemon, created: bool, status: int, content: bytes) -> None:
    """Delete the session a case created (POST /session answered 200)."""
    if created and status == 200:
        sid = orjson.loads(content)["sessionId"]
        deleted = httpx.delete(f"{daemon.url}/session/{sid}", headers=daemon.headers, timeout=30)
        assert deleted.status_code == 200


def test_no_generated_request_gets_a_server_error_or_a_shapeless_4xx(daemon: Daemon,
                                                                     real_session: str) -> None:
    schema = schemathesis.openapi.from_url(daemon.url + "/openapi.json", headers=daemon.headers, timeout=10)
    failures: list[str] = []
    tested = [0]

    def fuzz(strategy: st.SearchStrategy[schemathesis.Case], examples: int, spawning: bool) -> None:
        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=daemon.url, headers=daemon.headers, timeout=30)
            tested[0] += 1
            problem = shape_problem(response.status_code, response.content)
            if problem is not None:
                failures.append(f"{case.method} {case.formatted_path} -> {problem}")
            forget_created(daemon, spawning, response.status_code, response.content)

        run()

    operations = [result.ok() for result in schema.get_all_operations()]
    # DELETE last: it removes the real session the other operations use
    operations.sort(key=lambda op: op.method.upper() == "DELETE")
    assert {op.path for op in operations} >= {"/session", "/session/{session_id}/prompt",
                                               "/session/{session_id}/events", "/daemon/status"}
    for operation in operations:
        spawning = operation.method.upper() == "POST" and operation.path == "/session"
        variants: list[dict[str, str] | None] = [None]
        if "{session_id}" in operation.path and not operation.path.endswith("/events"):
            variants.append({"session_id": real_session})
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for path_parameters in variants:
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)
                try:
                    fuzz(strategy, SPAWNING_EXAMPLES if spawning else EXAMPLES, spawning)
                except Unsatisfiable:
                    assert mode is GenerationMode.NEGATIVE  # nothing to break in this operation
    assert tested[0] > 100
    assert failures == []
    assert daemon.proc.poll() is None
    status = httpx.get(daemon.url + "/daemon/status", headers=daemon.headers, timeout=10).json()
    assert len(status["sessions"]) <= 1  # the fuzz left no agent child behind


def json_body_fields(daemon: Daemon) -> dict[tuple[str, str], list[str]]:
    """(method, path) -> the property names of its JSON request body, from the served OpenAPI."""
    spec = httpx.get(daemon.url + "/openapi.json", headers=daemon.headers, timeout=10).json()
    schemas = spec.get("components", {}).get("schemas", {})
    out: dict[tuple[str, str], list[str]] = {}
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is None:
                continue
            schema = body["schema"]
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
            out[(method.upper(), path)] = sorted(schema.get("properties", {}))
    return out


def with_a_lone_surrogate(fields: list[str]) -> st.SearchStrategy[bytes]:
    """A JSON object body as a client's encoder writes it (``\\udXXX`` escapes) whose string values
    or keys hold a lone surrogate."""
    lone = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
    dirty = st.builds(lambda head, s, tail: head + s + tail, st.text(max_size=6), lone, st.text(max_size=6))
    dirty_key = st.dictionaries(dirty, st.text(max_size=4), min_size=1, max_size=1)
    dirty_value = st.dictionaries(st.sampled_from(fields), dirty, min_size=1, max_size=len(fields))
    nested = st.builds(lambda key, value: {key: {"inner": [value]}}, st.sampled_from(fields), dirty)
    return st.one_of(dirty_value, dirty_key, nested).map(lambda body: json.dumps(body).encode())


def test_a_lone_surrogate_in_any_json_body_field_is_a_400(daemon: Daemon, real_session: str) -> None:
    operations = json_body_fields(daemon)
    assert set(operations) == {("POST", "/session"), ("POST", "/session/{session_id}/prompt"),
                               ("POST", "/session/{session_id}/permission/{request_id}"), ("POST", "/gate")}
    failures: list[str] = []

    def fuzz(method: str, path: str, fields: list[str]) -> None:
        @settings(max_examples=SURROGATE_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(raw=with_a_lone_surrogate(fields))
        def run(raw: bytes) -> None:
            response = httpx.request(method, daemon.url + path, content=raw, timeout=30,
                                     headers={**daemon.headers, "content-type": "application/json"})
            problem = shape_problem(response.status_code, response.content)
            if problem is None and response.status_code != 400:
                problem = f"{response.status_code}, not 400"
            if problem is None and response.json()["error"]["type"] != "invalid_json":
                problem = f"400 of type {response.json()['error']['type']}"
            if problem is not None:
                failures.append(f"{method} {path} {raw[:80]!r} -> {problem}")

        run()

    for (method, template), fields in operations.items():
        fuzz(method, template.replace("{session_id}", real_session).replace("{request_id}", "perm_1"), fields)
    assert failures == []


def test_an_id_of_any_text_is_a_400_never_a_500(daemon: Daemon, real_session: str) -> None:
    failures: list[str] = []

    # header bytes a client can put on the wire: visible ASCII and any byte >= 0x80 (read as latin-1)
    header_bytes = st.lists(st.integers(0x21, 0x7E) | st.integers(0x80, 0xFF), max_size=12).map(bytes)

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(text=st.text(max_size=24), header=header_bytes)
    def run(text: str, header: bytes) -> None:
        cursor = httpx.get(f"{daemon.url}/session/{real_session}/transcript", params={"cursor": text},
                           headers=daemon.headers, timeout=30)
        problem = shape_problem(cursor.status_code, cursor.content)
        if problem is not None:
            failures.append(f"cursor {text!r} -> {problem}")
        with httpx.stream("GET", f"{daemon.url}/session/{real_session}/events", timeout=30,
                          headers={**daemon.headers, "Last-Event-ID": header}) as stream:
            if stream.status_code == 200:
                return  # a valid id (or blank): the stream is open; closing it is all we need
            problem = shape_problem(stream.status_code, stream.read())
            if problem is not None:
                failures.append(f"Last-Event-ID {header!r} -> {problem}")

    run()
    assert failures == []

