"""One shape for every limit (issue 24): a byte limit and a count limit answer the same JSON keys,
built by one constructor (``Ceiling.exceeded``). Walks every ceiling's error, then the daemon's
routes: each limit a route can answer, refused for real on a running ``hopline serve``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from hopline.budget import CEILINGS, FIXED, HOP_DAEMON_API, HOP_DAEMON_SSE, HOP_GATE, Budget
from hopline.daemon.errors import SessionError

from .support import running_daemon

LIMIT_KEYS = {"type", "hop", "setting", "limit", "observed", "unit", "message"}


def test_every_ceiling_answers_the_one_shape() -> None:
    """Exactly the one shape's keys, a byte limit's as a count's: no other key names a limit."""
    for ceiling in (*CEILINGS, *FIXED):
        error = ceiling.exceeded(1, 2).to_json()["error"]
        assert set(error) == LIMIT_KEYS, ceiling.key
        assert (error["limit"], error["observed"], error["unit"]) == (1, 2, ceiling.unit.value)
        assert (error["hop"], error["setting"]) == (ceiling.hop, ceiling.name)


def test_a_count_and_a_byte_limit_of_a_route_have_the_same_keys() -> None:
    count = SessionError.over_limit(429, "too_many_pending_prompts", "max_pending_prompts", 8, 9, "over",
                                    hop=HOP_DAEMON_API).body["error"]
    size = SessionError.over_limit(413, "request_entity_too_large", "daemon_json_body_limit", 10, 11, "over",
                                   hop=HOP_DAEMON_API).body["error"]
    assert set(count) == set(size) == LIMIT_KEYS
    assert (count["unit"], size["unit"]) == ("count", "bytes")


@pytest.mark.e2e
async def test_every_limit_the_routes_answer_has_the_same_keys(tmp_path: Path) -> None:
    budget = Budget.defaults()
    env = {"HOPLINE_MAX_LIVE_SESSIONS": "1", "HOPLINE_MAX_SUBSCRIBERS_PER_SESSION": "1"}
    seen: dict[str, dict[str, Any]] = {}
    with running_daemon(tmp_path, env=env) as daemon:
        headers = {"Authorization": f"Bearer {daemon.token}"}
        async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=60) as client:
            big = b'{"cwd": "' + b"x" * budget.daemon_json_body_limit + b'"}'
            answer = await client.post("/session", content=big, headers={"content-type": "application/json"})
            assert answer.status_code == 413
            seen["body bytes"] = answer.json()["error"]
            deep = "[" * (budget.json_max_depth + 1) + "]" * (budget.json_max_depth + 1)
            answer = await client.post("/session", content=f'{{"scripted": {{"x": {deep}}}}}',
                                       headers={"content-type": "application/json"})
            assert answer.status_code == 400
            seen["json depth"] = answer.json()["error"]
            created = await client.post("/session", json={"cwd": str(tmp_path)})
            assert created.status_code == 200, created.text
            session_id = created.json()["sessionId"]
            answer = await client.post("/session", json={"cwd": str(tmp_path)})
            assert answer.status_code == 503
            seen["live sessions"] = answer.json()["error"]
            async with client.stream("GET", f"/session/{session_id}/events") as first:
                assert first.status_code == 200
                answer = await client.get(f"/session/{session_id}/events")
                assert answer.status_code == 429
                seen["subscribers"] = answer.json()["error"]
            rounds = budget.gate_max_rounds + 1
            answer = await client.post("/gate", json={"repo": str(tmp_path), "rounds": rounds})
            assert answer.status_code == 400, answer.text
            seen["gate rounds"] = answer.json()["error"]
    hops = {"body bytes": HOP_DAEMON_API, "json depth": HOP_DAEMON_API, "live sessions": HOP_DAEMON_API,
            "subscribers": HOP_DAEMON_SSE, "gate rounds": HOP_GATE}
    units = {"body bytes": "bytes"}
    for name, error in seen.items():
        assert set(error) >= LIMIT_KEYS, (name, error)  # beside them, what the route adds (field, origin)
        assert error["hop"] == hops[name], name
        assert error["unit"] == units.get(name, "count"), name
        assert error["observed"] > error["limit"], name
