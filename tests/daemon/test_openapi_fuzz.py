"""schemathesis against the live daemon's /openapi.json: no generated request gets a 5xx."""

from __future__ import annotations

from pathlib import Path

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from .support import running_daemon

EXAMPLES = 15
SPAWNING_EXAMPLES = 6  # POST /session starts a real agent process per accepted case


def test_no_generated_request_gets_a_server_error(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        session = httpx.post(daemon.url + "/session", json={"cwd": str(tmp_path)}, headers=daemon.headers,
                             timeout=30)
        assert session.status_code == 200
        real_id = session.json()["sessionId"]
        schema = schemathesis.openapi.from_url(daemon.url + "/openapi.json", headers=daemon.headers,
                                               timeout=10)
        failures: list[str] = []
        tested = 0
        operations = [result.ok() for result in schema.get_all_operations()]
        # DELETE last: it removes the real session the other operations use
        operations.sort(key=lambda op: op.method.upper() == "DELETE")
        for operation in operations:
            spawning = operation.method.upper() == "POST" and operation.path == "/session"
            variants: list[dict[str, str] | None] = [None]
            if "{session_id}" in operation.path and not operation.path.endswith("/events"):
                variants.append({"session_id": real_id})
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                for path_parameters in variants:
                    strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

                    @settings(max_examples=SPAWNING_EXAMPLES if spawning else EXAMPLES, deadline=None,
                              database=None, suppress_health_check=list(HealthCheck))
                    @given(case=strategy)
                    def run(case: schemathesis.Case) -> None:
                        nonlocal tested
                        response = case.call(base_url=daemon.url, headers=daemon.headers, timeout=30)
                        tested += 1
                        if response.status_code >= 500:
                            failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                            f"{response.text[:200]}")

                    try:
                        run()
                    except Unsatisfiable:
                        assert mode is GenerationMode.NEGATIVE  # nothing to break in this operation
        assert tested > 100
        assert failures == []
        assert daemon.proc.poll() is None
