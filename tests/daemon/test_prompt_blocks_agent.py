"""`hopline agent` under `hopline serve` takes the blocks it advertises (issue 28): a resource_link
to a file inside the session's cwd reaches the model (a strict OpenAI-compatible provider, which
records every request) with its distinctive line; one outside the cwd reaches it as the link only,
and the agent says it did not read it; an embedded resource reaches it as text. Through this path
the agent also gets its gateway credential, which it claims in its initialize answer (T-8)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strict_openai import Reply, StrictOpenAI

from .support import read_events, running_daemon
from .test_serve import new_session, texts, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes

LINE = "DISTINCTIVE-LINE 7f3a: calc adds with carry"
OUTSIDE = "OUTSIDE-SECRET-LINE 19c2"


@pytest.fixture
def strict() -> Iterator[StrictOpenAI]:
    with StrictOpenAI() as server:
        server.reply = Reply("read it", [])
        yield server


def _user_text(request: dict[str, object]) -> str:
    messages = request["messages"]
    assert isinstance(messages, list)
    return "\n".join(str(m.get("content")) for m in messages if m.get("role") == "user")


async def test_resource_link_and_embedded_resource_reach_the_model(strict: StrictOpenAI,
                                                                   tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "calc.py").write_text(f"def add(a, b):\n    # {LINE}\n    return a + b\n")
    (tmp_path / "outside.txt").write_text(OUTSIDE)
    (workspace / "escape.txt").symlink_to(tmp_path / "outside.txt")
    env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": strict.base_url, "OPENAI_API_KEY": "sk-e2e",
           "HOPLINE_MODEL": "strict-model"}
    blocks = [{"type": "text", "text": "look at"},
              {"type": "resource_link", "uri": (workspace / "calc.py").as_uri(), "name": "calc.py"},
              {"type": "resource_link", "uri": (tmp_path / "outside.txt").as_uri(), "name": "outside.txt"},
              {"type": "resource_link", "uri": "escape.txt", "name": "escape.txt"},
              {"type": "resource", "resource": {"uri": "mem://note", "text": "EMBEDDED-NOTE 55"}}]
    with running_daemon(tmp_path, agent_cmd=None, env=env) as daemon:
        async with daemon.client(timeout=60) as client:
            sid = await new_session(client, workspace, permissionMode="auto")
            accepted = await client.post(f"/session/{sid}/prompt", json={"prompt": blocks})
            assert accepted.status_code == 202, accepted.text
            events = await read_events(client, sid, turns_done(1))
    assert events[-1].type == "turn_complete", events[-1].data
    assert strict.rejections == [] and strict.requests
    seen = _user_text(strict.requests[0])
    assert LINE in seen and "EMBEDDED-NOTE 55" in seen and "look at" in seen
    assert OUTSIDE not in seen  # neither by its absolute path nor through a symlink
    assert (tmp_path / "outside.txt").as_uri() in seen and "escape.txt" in seen
    said = "".join(texts(events))
    assert "I did not read the linked file outside.txt" in said
    assert "I did not read the linked file escape.txt" in said
    echoed = [e.data["update"]["content"] for e in events if e.type == "session_update"
              and e.data["update"]["sessionUpdate"] == "user_message_chunk"]
    assert echoed == blocks
