"""The console survives any update (issue #26): in a real Chromium, a hostile agent's updates of
every kind in shapes its renderers do not expect. Each one a renderer cannot show is shown raw
(escaped JSON, a note), the stream never drops for it, and the events after it are shown."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from daemon.support import Daemon, running_daemon

from .conftest import PageWatch, screenshot
from .test_browser import WAIT_MS, create_session, send, turn_ends

pytestmark = pytest.mark.e2e  # every test here starts real processes

TOKEN = "console-malformed-token-5c1d"
HOSTILE_AGENT = Path(__file__).parents[1] / "daemon" / "agents" / "hostile_agent.py"


@pytest.fixture(scope="module")
def hostile_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("console-hostile"), token=TOKEN,
                        agent_cmd=f"{sys.executable} {HOSTILE_AGENT}") as daemon:
        yield daemon


def test_malformed_updates_of_every_kind_are_shown_raw_and_the_stream_goes_on(
        hostile_daemon: Daemon, tmp_path: Path, watched_page: PageWatch) -> None:
    sys.path.insert(0, str(HOSTILE_AGENT.parent))
    from hostile_agent import MALFORMED  # the shapes the agent sends

    page = watched_page.page
    page.goto(f"{hostile_daemon.url}/ui/#token={TOKEN}")
    session_id = create_session(page, str(tmp_path))
    send(page, "malformed")
    turn_ends(page, 1)
    events = page.get_by_test_id("session-events")
    events.get_by_text("malformed done").wait_for(timeout=WAIT_MS)
    send(page, "after the malformed ones")  # the page still streams: a later turn shows up
    turn_ends(page, 2)
    assert events.get_by_text("echo: after the malformed ones").count() == 1
    raw = events.get_by_test_id("raw-event")
    shown = [raw.nth(i).inner_text() for i in range(raw.count())]
    assert shown, "no malformed update needed the raw view"
    assert any('"entries": "not a list"' in text for text in shown)  # plan.entries a string (the issue's)
    for text in shown:
        assert "could not be shown" in text and "as the daemon sent it" in text
    # nothing an agent sent became markup, and the stream never dropped nor restarted for it
    assert page.locator("[data-injected]").count() == 0
    assert page.get_by_test_id("stream-drop").count() == 0
    streams = [url for url, _ in watched_page.requests if url.endswith(f"/session/{session_id}/events")]
    assert len(streams) == 1
    # every malformed update reached the page: as an item it rendered or as a raw one
    status = httpx.get(f"{hostile_daemon.url}/daemon/status", headers=hostile_daemon.headers, timeout=10)
    row = next(s for s in status.json()["sessions"] if s["sessionId"] == session_id)
    assert row["pendingPermissions"] == 1  # the malformed permission request, pending and shown
    assert len(MALFORMED) > 10
    screenshot(page, "session-malformed-updates")
