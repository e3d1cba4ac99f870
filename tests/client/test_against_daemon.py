"""The SDK against a real daemon (`hopline serve` with its agent children and scripted model)."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.client import DaemonClient, DaemonError, Event, RequestTooLarge, SseEventTooLarge
from hopline.client.turn import TurnTracker
from hopline.embedded import EmbeddedStack

pytestmark = pytest.mark.e2e  # every test here starts real processes

SCRIPT = {"iterations": 3, "toolsPerIteration": 2}


async def _turn(client: DaemonClient, session_id: str, text: str) -> tuple[str, list[Event]]:
    prompt_id = await client.prompt(session_id, text)
    events: list[Event] = []
    async with aclosing(client.turn_events(session_id, prompt_id)) as stream:
        async for event in stream:
            events.append(event)
    return prompt_id, events


async def test_turn_events_in_order_end_to_end(daemon: EmbeddedStack, workspace: Path) -> None:
    async with DaemonClient(daemon.url, daemon.token, budget=Budget.defaults()) as client:
        session_id = await client.create_session(cwd=str(workspace), profile="qa_automation",
                                                 permission_mode="auto", scripted=SCRIPT)
        prompt_id, events = await _turn(client, session_id, "review the test logs")
        journaled = [e for e in events if not e.synthetic]
        ids = [e.id for e in journaled]
        assert ids == list(range(ids[0], ids[0] + len(ids)))  # contiguous, in order, no duplicate
        assert journaled[-1].type == "turn_complete" and journaled[-1].prompt_id == prompt_id
        tracker = TurnTracker(prompt_id)
        for event in events:
            tracker.apply(event)
        assert tracker.stop_reason == "end_turn"
        assert tracker.iterations >= 3 and tracker.progress["maxIterations"] == 60
        assert any(c.status == "completed" for c in tracker.tool_calls.values())
        assert tracker.final_text

        # Large tool outputs went to sidecars: the wire kept a preview, the SDK resolves the whole
        # body and verifies its size and sha256.
        refs = [ref for ref in tracker.sidecar_refs() if ref.resolvable]
        assert refs, "the sample workspace's logs are over the sidecar threshold"
        body = await client.resolve_sidecar(session_id, refs[0])
        assert len(body) == refs[0].bytes > Budget.defaults().sidecar_threshold_bytes
        call = next(c for c in tracker.tool_calls.values() if refs[0] in c.sidecars)
        assert call.output_chars < refs[0].bytes

        # Resume from the middle: exactly the rest, no loss, no duplicate.
        middle = ids[len(ids) // 2]
        rest: list[int | None] = []
        async with aclosing(client.events(session_id, last_event_id=middle)) as stream:
            async for event in stream:
                if event.type == "replay_complete":
                    break
                rest.append(event.id)
        assert rest == [i for i in ids if i > middle]

        page = await client.transcript(session_id)
        assert [e["id"] for e in page.events][: len(ids)] == ids
        status = await client.status()
        assert status["runtime"]["perf"]["pipe"]["inbound"]["count"] > 0
        await client.delete_session(session_id)


async def test_api_errors_name_the_hop_and_never_the_session_id(daemon: EmbeddedStack) -> None:
    async with DaemonClient(daemon.url, daemon.token, budget=Budget.defaults()) as client:
        try:
            await client.prompt("no-such-session-42", "hi")
        except DaemonError as exc:
            assert exc.status == 404
            assert "no-such-session-42" not in str(exc)
        else:
            raise AssertionError("expected a 404")
    async with DaemonClient(daemon.url, "wrong-token", budget=Budget.defaults()) as client:
        try:
            await client.status()
        except DaemonError as exc:
            assert exc.status == 401
        else:
            raise AssertionError("expected a 401")


async def test_permission_requests_are_answered_through_the_sdk(daemon: EmbeddedStack,
                                                                 workspace: Path) -> None:
    answered: list[str] = []
    async with DaemonClient(daemon.url, daemon.token, budget=Budget.defaults()) as client:
        session_id = await client.create_session(cwd=str(workspace), profile="qa_automation",
                                                 permission_mode="ask", scripted=SCRIPT)
        prompt_id = await client.prompt(session_id, "run the tests")
        tracker = TurnTracker(prompt_id)
        async with aclosing(client.turn_events(session_id, prompt_id)) as stream:
            async for event in stream:
                tracker.apply(event)
                if event.type == "permission_request":
                    # Allow the first, reject the rest: both answers reach the agent.
                    option = "allow_once" if not answered else "reject_once"
                    await client.answer_permission(session_id, event.data["requestId"], option)
                    answered.append(option)
        await client.delete_session(session_id)
    assert answered, "the scripted gate runs commands, which ask for permission"
    assert tracker.stop_reason == "end_turn"
    statuses = {c.status for c in tracker.tool_calls.values()}
    assert "completed" in statuses


async def test_event_over_the_client_limit_is_refused_against_the_daemon(daemon: EmbeddedStack,
                                                                           workspace: Path) -> None:
    # Tool outputs of the sample workspace are far over 4 KiB; the reader refuses them clearly.
    limit = 4096
    budget = Budget.defaults().replace(client_sse_max_event_bytes=limit)
    async with DaemonClient(daemon.url, daemon.token, budget=budget) as client:
        session_id = await client.create_session(cwd=str(workspace), profile="qa_automation",
                                                 permission_mode="auto", scripted=SCRIPT)
        prompt_id = await client.prompt(session_id, "review the logs")
        try:
            async with aclosing(client.turn_events(session_id, prompt_id)) as stream:
                async for _ in stream:
                    pass
        except SseEventTooLarge as exc:
            assert exc.limit == limit and exc.observed > limit
            assert str(exc).startswith(f"hop client.sse: event exceeds {limit} bytes (read ")
        else:
            raise AssertionError("expected SseEventTooLarge")
        assert client.max_buffered <= limit + 65536  # the limit plus at most one read chunk
        await client.cancel(session_id)
        await client.delete_session(session_id)


async def test_prompt_at_the_daemon_body_limit_passes_one_byte_over_is_refused_unsent(
        daemon: EmbeddedStack, workspace: Path) -> None:
    budget = Budget.defaults()
    limit = budget.daemon_json_body_limit
    overhead = len(b'{"text":""}')
    async with DaemonClient(daemon.url, daemon.token, budget=budget) as client:
        session_id = await client.create_session(cwd=str(workspace), scripted={"iterations": 0})
        with pytest.raises(RequestTooLarge) as err:
            await client.prompt(session_id, "x" * (limit - overhead + 1))
        assert err.value.status == 413 and err.value.hop == "daemon.api"
        assert (err.value.limit, err.value.observed) == (limit, limit + 1)
        assert f"limit {limit} bytes, observed {limit + 1} bytes" in str(err.value)
        # Exactly the limit: the daemon accepts it (its own boundary is inclusive too).
        prompt_id = await client.prompt(session_id, "x" * (limit - overhead))
        async with aclosing(client.turn_events(session_id, prompt_id)) as stream:
            async for _ in stream:
                pass
        await client.delete_session(session_id)
