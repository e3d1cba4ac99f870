"""The console in a real headless Chromium against real `hopline serve` daemons on 127.0.0.1.

Everything the user does here goes through the page (its forms and buttons); the tests only read
the daemon's API on the side to check what the page shows. Each test fails on any JavaScript console
error (the `watched_page` fixture), and the screenshots of every view, light and dark, are saved as
artifacts (tests/artifacts/console, or $HOPLINE_TEST_ARTIFACTS/console).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from daemon.support import BIG_AGENT_CMD, Daemon, running_daemon
from hopline.budget import Budget

from .conftest import DroppingProxy, PageWatch, screenshot

pytestmark = pytest.mark.e2e  # every test here starts real processes

TOKEN = "console-browser-token-93ab"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def hopline_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """`hopline serve` as a user starts it: it makes the token and prints the console URL."""
    with running_daemon(tmp_path_factory.mktemp("console-hopline"), token="", agent_cmd=None) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def sdk_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """`hopline serve` with a third-party agent written on the ACP SDK, and a token of the operator's."""
    tmp = tmp_path_factory.mktemp("console-sdk")
    with running_daemon(tmp, token=TOKEN, agent_cmd=BIG_AGENT_CMD) as daemon:
        yield daemon


def no_token_leaked(watch: PageWatch, daemon: Daemon, *, refused: tuple[str, ...] = ()) -> None:
    """No request URL holds the token; every API call sends it (or a token typed and ``refused``)
    as a bearer header; the daemon's output holds it only where `hopline serve` printed it."""
    urls = [url for url, _ in watch.requests]
    assert urls and not [url for url in urls if daemon.token in url]
    for url, headers in watch.requests:  # the static files go without it, every API call with it
        if url.startswith("http") and "/ui/" not in url:
            assert headers.get("authorization") in {f"Bearer {t}" for t in (daemon.token, *refused)}, url
        else:
            assert "authorization" not in headers, url
    assert daemon.token not in daemon.log_text()  # the daemon's log (stderr): no token, no URL with it
    # off a terminal `serve` never prints the token, not even the one it made (that one is in its file)
    assert [line for line in daemon.stdout_lines if daemon.token in line] == []


def create_session(page: Any, cwd: str, *, profile: str = "", mode: str = "", scripted: str = "") -> str:
    page.get_by_test_id("new-session-cwd").fill(cwd)
    page.get_by_test_id("new-session-profile").fill(profile)
    page.get_by_test_id("new-session-mode").select_option(mode)
    if scripted:
        page.get_by_text("Scripted model hints").click()
        page.get_by_test_id("new-session-scripted").fill(scripted)
    page.get_by_role("button", name="Create session").click()
    page.wait_for_url(re.compile(r"#/session/[0-9a-f]+$"))
    page.get_by_test_id("prompt-input").wait_for()
    return page.url.rsplit("/", 1)[1]


def send(page: Any, text: str) -> None:
    page.get_by_test_id("prompt-input").fill(text)
    page.get_by_test_id("send").click()


def turn_ends(page: Any, count: int) -> None:
    page.wait_for_function(
        "n => document.querySelectorAll('[data-testid=turn-complete], [data-testid=turn-error]').length >= n",
        arg=count, timeout=WAIT_MS)


def views_in_both_themes(page: Any, prefix: str, views: list[tuple[str, str]]) -> None:
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for route, ready in views:
            page.evaluate("route => { location.hash = route; }", f"#/{route}")
            page.locator(ready).first.wait_for()
            page.wait_for_timeout(150)  # let the layout settle (no assertion depends on it)
            screenshot(page, f"{prefix}-{route.split('/')[0]}-{scheme}")
    page.emulate_media(color_scheme="light")


def test_the_main_flow_through_the_ui(hopline_daemon: Daemon, workspace: Path,
                                      watched_page: PageWatch) -> None:
    """Sign in with the URL `serve` prints on a terminal, create a session, send a prompt whose tools
    make sidecar-backed outputs, see the text and the tools stream in, download a sidecar and check its
    sha256; then the budget chain with the engine ceiling's exact bytes and a histogram with non-empty
    buckets."""
    page = watched_page.page
    daemon = hopline_daemon
    page.goto(daemon.signed_in_console_url)
    page.get_by_test_id("sessions").wait_for()
    assert "token" not in page.url  # the fragment left the address bar ...
    assert page.evaluate("sessionStorage.getItem('hopline.token')") == daemon.token  # ... for this tab

    session_id = create_session(page, str(workspace), profile="qa_automation", mode="auto")
    send(page, "gate the change")
    events = page.get_by_test_id("session-events")
    turn_ends(page, 1)
    assert page.get_by_test_id("turn-complete").inner_text().count("stop reason end_turn") == 1
    assert "Done after" in events.locator(".item.text.agent").last.inner_text()
    statuses = events.locator("article.tool").evaluate_all("cards => cards.map(c => c.dataset.status)")
    assert len(statuses) >= 6 and set(statuses) <= {"completed", "failed"}  # none left dangling
    compaction = events.get_by_test_id("compaction").first.inner_text()
    assert re.search(r"trigger (model|transport) · replaced \d+ messages / [\d,]+ B", compaction), compaction
    progress = page.get_by_test_id("progress").inner_text()
    assert re.search(r"iteration \d+/60", progress) and "/ 8 MiB ceiling" in progress, progress
    assert re.search(r"estimate [\d.]+k / 128\.0k tokens", progress), progress

    # a sidecar: size, head and tail, and a download checked in the browser
    sidecar = events.get_by_test_id("sidecar").first
    sidecar_id = sidecar.get_attribute("data-sidecar-id")
    sidecar.locator("summary").click()
    assert sidecar.locator("pre.head").inner_text() and sidecar.locator("pre.tail").inner_text()
    with page.expect_download() as download:
        sidecar.get_by_test_id("sidecar-download").click()
    body = Path(download.value.path()).read_bytes()
    sidecar.locator(".verify.good").wait_for()
    verdict = sidecar.locator(".verify").inner_text()
    assert f"{len(body):,} bytes, sha256 verified ({hashlib.sha256(body).hexdigest()[:16]}" in verdict
    served = httpx.get(f"{daemon.url}/session/{session_id}/sidecars/{sidecar_id}", headers=daemon.headers)
    assert body == served.content and served.headers["etag"] == f'"{hashlib.sha256(body).hexdigest()}"'
    assert f"{len(body):,} B" in sidecar.inner_text()
    assert len(body) > Budget.defaults().sidecar_threshold_bytes
    screenshot(page, "session-sidecar-verified")

    # the sessions list
    nav = page.locator("#nav")
    nav.get_by_role("link", name="Sessions").click()
    row = page.locator(f"tr[data-session='{session_id}']")
    row.wait_for()
    mine = session_row(daemon, session_id)  # the page shows what the daemon reports (it polls)
    expect(row.locator("td")).to_have_text(["idle", "0", "0", "0", f"{mine['lastEventId']:,}", "0", "0"],
                                           timeout=10_000)  # ready, and doing nothing
    status = httpx.get(daemon.url + "/daemon/status", headers=daemon.headers).json()

    # the budget chain: every byte ceiling, the engine ceiling in exact bytes and marked narrowest
    nav.get_by_role("link", name="Budget chain").click()
    chain = page.get_by_test_id("budget-chain")
    engine = chain.locator("[data-ceiling=HOPLINE_TRANSPORT_MAX_BODY_BYTES]")
    engine.wait_for()
    assert "8,388,608 B" in engine.inner_text() and "narrowest on the request path" in engine.inner_text()
    assert chain.locator(".bar-row.narrowest").count() == 1
    byte_ceilings = [c for c in status["budget"]["ceilings"] if "bytes" in c]
    assert chain.locator("[data-ceiling]").count() == len(byte_ceilings)
    assert "Coherent: no errors, no warnings." in chain.inner_text()

    # the frame histogram: non-empty buckets, the counts the daemon reports, three lines
    nav.get_by_role("link", name="Pipe frames").click()
    histogram = page.get_by_test_id("frame-histogram")
    inbound = histogram.locator("figure[data-direction=inbound]")
    inbound.locator("rect.bucket").first.wait_for()
    drawn = sum(inbound.locator("rect.bucket").evaluate_all("rs => rs.map(r => Number(r.dataset.count))"))
    frames = httpx.get(daemon.url + "/daemon/frames", headers=daemon.headers).json()
    assert drawn == frames["histogram"]["directions"]["inbound"]["count"] > 0
    assert inbound.locator("line.limit").count() == 3
    assert "262,144 B" in histogram.inner_text() and "33,554,432 B" in histogram.inner_text()
    page.get_by_test_id("large-frames").wait_for()

    views_in_both_themes(page, "hopline", [
        ("sessions", "[data-testid=sessions] tr[data-session]"),
        (f"session/{session_id}", "[data-testid=turn-complete]"),
        ("budget", "[data-ceiling]"),
        ("frames", "rect.bucket")])
    no_token_leaked(watched_page, daemon)


def test_sign_in_permissions_cancel_streaming_and_large_frames(sdk_daemon: Daemon, tmp_path: Path,
                                                                watched_page: PageWatch) -> None:
    """With the operator's own token the page asks for it; permission requests are answered with
    allow and deny, a running turn is cancelled, chunks stream into one message, and a large pipe
    frame shows up in the large-frame records with its origin class and update kind."""
    page = watched_page.page
    daemon = sdk_daemon
    page.goto(daemon.console_url)
    form = page.get_by_test_id("sign-in")
    form.wait_for()
    page.emulate_media(color_scheme="light")
    screenshot(page, "sign-in-light")
    page.emulate_media(color_scheme="dark")
    screenshot(page, "sign-in-dark")
    page.emulate_media(color_scheme="light")
    page.get_by_label("Daemon token").fill("not-the-token")
    page.get_by_role("button", name="Sign in").click()
    form.get_by_text("The daemon refused this token.").wait_for()
    assert page.evaluate("sessionStorage.getItem('hopline.token')") is None
    watched_page.allowed.append(re.compile(r"^console\.error: Failed to load resource: the server responded "
                                           r"with a status of 401 \(Unauthorized\)$"))  # that one refusal
    page.get_by_label("Daemon token").fill(TOKEN)
    page.get_by_label("Daemon token").press("Enter")  # the keyboard alone signs in
    page.get_by_test_id("sessions").wait_for()
    theme = page.get_by_role("button", name=re.compile("^Theme"))
    theme.click()
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    theme.click()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    theme.click()
    assert page.evaluate("document.documentElement.dataset.theme") is None  # back to the system's

    create_session(page, str(tmp_path))
    events = page.get_by_test_id("session-events")
    send(page, "permission")
    request = events.get_by_test_id("permission-request").nth(0)
    request.wait_for()
    assert "run something" in request.inner_text()
    screenshot(page, "session-permission")
    request.get_by_test_id("permission-allow").focus()
    page.keyboard.press("Enter")  # a keyboard answer
    turn_ends(page, 1)
    expect(request).to_contain_text("answered: Allow")
    send(page, "permission")
    denied = events.get_by_test_id("permission-request").nth(1)
    denied.get_by_test_id("permission-deny").click()
    turn_ends(page, 2)
    expect(denied).to_contain_text("answered: Deny")
    texts = events.locator(".item.text.agent").all_inner_texts()
    assert "permission: allow" in texts and "permission: deny" in texts

    send(page, "sleep 60")
    events.get_by_text("sleeping", exact=True).wait_for()
    page.get_by_test_id("cancel").click()
    turn_ends(page, 3)
    assert "stop reason cancelled" in events.get_by_test_id("turn-complete").nth(2).inner_text()

    page.get_by_test_id("prompt-input").fill("chunks 5 40")
    page.get_by_test_id("prompt-input").press("Control+Enter")  # sends from the keyboard
    turn_ends(page, 4)
    streamed = events.locator(".item.text.agent").last.inner_text()
    assert [int(n) for n in re.findall(r"chunk (\d+)", streamed)] == [0, 1, 2, 3, 4]  # one message, in order

    send(page, "big 400000")
    turn_ends(page, 5)
    card = events.locator("article.tool").last
    assert card.get_attribute("data-status") == "completed" and "400,000 B" in card.inner_text()

    page.locator("#nav").get_by_role("link", name="Pipe frames").click()
    records = page.get_by_test_id("large-frames").locator("li.record")
    records.first.wait_for()
    newest = records.first.inner_text()
    assert "inbound" in newest and "session_update_notification · tool_call_update" in newest
    assert "largest text 400,000 B" in newest
    assert "0 suppressed" in page.get_by_test_id("large-frames").inner_text()
    screenshot(page, "frames-large-records")
    no_token_leaked(watched_page, daemon, refused=("not-the-token",))


def session_row(daemon: Daemon, session_id: str) -> dict[str, Any]:
    status = httpx.get(daemon.url + "/daemon/status", headers=daemon.headers, timeout=10).json()
    return next(s for s in status["sessions"] if s["sessionId"] == session_id)


def test_the_stream_resumes_with_last_event_id_after_a_dropped_connection(
        sdk_daemon: Daemon, tmp_path: Path, watched_page: PageWatch) -> None:
    """The network drops under the page: it says so, resumes with Last-Event-ID and shows the
    events it missed, each once."""
    page = watched_page.page
    daemon = sdk_daemon
    port = int(daemon.url.rsplit(":", 1)[1])
    with DroppingProxy(port) as proxy:
        page.goto(f"http://127.0.0.1:{proxy.port}/ui/#token={TOKEN}")
        session_id = create_session(page, str(tmp_path))
        send(page, "chunks 2 20")
        turn_ends(page, 1)
        last_seen = session_row(daemon, session_id)["lastEventId"]
        page.wait_for_function("id => document.querySelector('[data-testid=stream-status]')"
                               ".textContent.endsWith('last event id ' + id)", arg=last_seen)

        proxy.hold_and_cut()  # the network goes; the page's reconnects wait in the proxy
        drop = page.get_by_test_id("stream-drop")
        drop.wait_for()
        assert f"Connection dropped after event {last_seen}." in drop.inner_text()
        prompt = httpx.post(f"{daemon.url}/session/{session_id}/prompt", headers=daemon.headers,
                            json={"text": "echo missed while the network was down"}, timeout=10)
        assert prompt.status_code == 202
        for _ in range(600):  # bounded: the echo turn takes milliseconds
            row = session_row(daemon, session_id)
            if row["pendingPrompts"] == 0:
                break
            page.wait_for_timeout(50)
        missed = row["lastEventId"] - last_seen
        assert missed >= 2  # the echoed text and turn_complete
        screenshot(page, "session-connection-dropped")
        proxy.release()  # the network is back

        resumed = page.get_by_test_id("stream-resume")
        resumed.wait_for(timeout=WAIT_MS)
        assert (f"Connection resumed with Last-Event-ID {last_seen}: {missed} missed events replayed"
                in resumed.inner_text())
        assert f"resumed with Last-Event-ID {last_seen}" in page.get_by_test_id("stream-status").inner_text()
        turn_ends(page, 2)
        events = page.get_by_test_id("session-events")
        assert events.get_by_text("echo: echo missed while the network was down").count() == 1
        assert events.get_by_test_id("turn-complete").count() == 2  # nothing shown twice
        screenshot(page, "session-resumed")
    streams = [h for url, h in watched_page.requests if url.endswith(f"/session/{session_id}/events")]
    assert "last-event-id" not in streams[0] and streams[-1]["last-event-id"] == str(last_seen)
    # Chromium logs the responses the cut tore (the stream, and a status poll when one was in flight):
    # the network errors this test causes on purpose, and nothing else
    watched_page.allowed.append(re.compile(r"^console\.error: Failed to load resource: "
                                           r"net::ERR_(INCOMPLETE_CHUNKED_ENCODING|CONTENT_LENGTH_MISMATCH)$"))


def test_the_page_says_what_the_session_is_doing(sdk_daemon: Daemon, tmp_path: Path,
                                                 watched_page: PageWatch) -> None:
    """The session's badge, on its page and in the sessions list: running while a prompt runs,
    awaiting permission while the agent waits for an answer, idle once the turn ended."""
    page = watched_page.page
    daemon = sdk_daemon
    page.goto(daemon.signed_in_console_url)
    session_id = create_session(page, str(tmp_path))
    badge = page.locator(".session-head").get_by_test_id("session-state")
    expect(badge).to_have_text("idle", timeout=WAIT_MS)
    events = page.get_by_test_id("session-events")

    send(page, "sleep 60")
    events.get_by_text("sleeping", exact=True).wait_for()
    expect(badge).to_have_text("running", timeout=WAIT_MS)
    assert "activity-running" in (badge.get_attribute("class") or "")
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "session-running")
    page.locator("#nav").get_by_role("link", name="Sessions").click()
    listed = page.locator(f"tr[data-session='{session_id}']").get_by_test_id("session-state")
    expect(listed).to_have_text("running", timeout=WAIT_MS)
    page.locator(f"tr[data-session='{session_id}'] a").click()
    page.get_by_test_id("cancel").click()
    turn_ends(page, 1)
    expect(badge).to_have_text("idle", timeout=WAIT_MS)

    send(page, "permission")
    request = events.get_by_test_id("permission-request").nth(0)
    request.wait_for()
    expect(badge).to_have_text("awaiting permission", timeout=WAIT_MS)
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "session-awaiting-permission")
    request.get_by_test_id("permission-allow").click()
    turn_ends(page, 2)
    expect(badge).to_have_text("idle", timeout=WAIT_MS)
    page.locator("#nav").get_by_role("link", name="Sessions").click()
    expect(listed).to_have_text("idle", timeout=WAIT_MS)


def test_console_modules_at_their_limits(sdk_daemon: Daemon, watched_page: PageWatch) -> None:
    """The page's own SSE parser and sidecar reader, run in Chromium: an event exactly at the
    client reader ceiling passes and one byte over is refused; split chunks and CRLF parse alike;
    sidecar entries resolve legacy fields, JSON pointers and path arrays to their previews."""
    page = watched_page.page
    page.goto(sdk_daemon.url + "/ui/")
    page.get_by_test_id("sign-in").wait_for()
    result = page.evaluate("""async () => {
      const { SseParser, SseEventTooLarge } = await import('./js/sse.js');
      const { sidecarEntries } = await import('./js/sidecars.js');
      const enc = new TextEncoder();
      const feed = (limit, text, split) => {
        const parser = new SseParser(limit);
        const bytes = enc.encode(text);
        const cut = split ?? bytes.length;
        try {
          return [...parser.feed(bytes.subarray(0, cut)), ...parser.feed(bytes.subarray(cut))];
        } catch (exc) {
          if (!(exc instanceof SseEventTooLarge)) return String(exc);
          return { refused: exc.limit, seen: exc.seen, hop: exc.hop };
        }
      };
      // id "7" (1) + event "x" (1) + data "ab\\ncd" (5) = 7 bytes of field values
      const event = 'id: 7\\nevent: x\\ndata: ab\\ndata: cd\\n\\n';
      const marker = '\\n… [hopline: 9000 bytes in sidecar S1; 6 shown] …\\n';
      const update = {
        sessionUpdate: 'tool_call_update',
        content: [{ type: 'content', content: { type: 'text', text: 'HEAD' + marker + 'TL' } }],
        rawOutput: { 'hopline.sidecar': 'S2', bytes: 500, preview: 'h2' + marker + 't2' },
        plan: { deep: ['x', 'P3' + marker + 'T3'] },
        _meta: { 'hopline.sidecar': [
          { field: 'content[0].text', id: 'S1', bytes: 9000, sha256: 'AB', mediaType: 'text/plain' },
          { field: 'rawOutput', path: '/rawOutput', id: 'S2', bytes: 500, sha256: 'cd',
            mediaType: 'application/json' },
          { field: 'plan', path: ['plan', 'deep', 1], truncated: true, reason: 'quota', bytes: 70 },
        ] },
      };
      return {
        atLimit: feed(7, event),
        overLimit: feed(6, event),
        splitInValue: feed(7, event, 20),
        crlf: feed(7, event.replaceAll('\\n', '\\r\\n'), 6),
        heartbeatOnly: feed(1, ': ' + 'h'.repeat(100) + '\\n\\n'),
        pendingLineOver: feed(6, 'data: ' + 'z'.repeat(7)),
        entries: sidecarEntries(update),
      };
    }""")
    assert result["atLimit"] == [{"id": "7", "event": "x", "data": "ab\ncd", "size": 7}]
    assert result["overLimit"] == {"refused": 6, "seen": 7, "hop": "client.sse"}
    assert result["splitInValue"] == result["atLimit"] == result["crlf"]
    assert result["heartbeatOnly"] == []  # comments are skipped, never counted nor buffered
    assert result["pendingLineOver"] == {"refused": 6, "seen": 7, "hop": "client.sse"}  # before the newline
    first, second, third = result["entries"]
    assert (first["head"], first["tail"], first["sha256"], first["resolvable"]) == ("HEAD", "TL", "ab", True)
    assert (second["head"], second["tail"], second["mediaType"]) == ("h2", "t2", "application/json")
    assert (third["head"], third["tail"], third["reason"]) == ("P3", "T3", "quota")
    assert third["resolvable"] is False
    assert json.dumps(result)  # plain data came back


def test_a_gate_run_live_in_the_page(hopline_daemon: Daemon, tmp_path: Path, watched_page: PageWatch) -> None:
    """Start a gate run from the page, see one row per gate agent get its verdict and findings live,
    the run's end and its exit code; then the list of runs."""
    from hopline.scripted.sample_pull_request import make_sample_pull_request

    repo, base, head = make_sample_pull_request(tmp_path / "pr", log_bytes=4096, logs=1, failing_log=True)
    page = watched_page.page
    daemon = hopline_daemon
    page.goto(daemon.signed_in_console_url)
    page.locator("#nav").get_by_role("link", name="Gate runs").click()
    page.get_by_test_id("gate-runs").wait_for()
    page.get_by_test_id("gate-repo").fill(str(repo))
    page.get_by_role("button", name="Start gate run").click()
    page.wait_for_url(re.compile(r"#/gate/g_[0-9a-f]+$"))
    gate_id = page.url.rsplit("/", 1)[1]
    result = page.get_by_test_id("gate-result")
    expect(result).to_have_text(re.compile(r"^done · exit 1"), timeout=WAIT_MS)
    agents = page.get_by_test_id("gate-agents")
    rows = agents.locator("tr[data-agent]")
    names = ("qa_automation", "qa_performance_security", "qa_strategy", "appsec")
    assert rows.evaluate_all("rs => rs.map(r => [r.dataset.agent, r.dataset.verdict, r.dataset.item])") == [
        [agent, "fail", "gate_failed"] for agent in names]
    rules = {agent: sorted(set(agents.locator(f"tr[data-agent={agent}] li[data-rule]")
                               .evaluate_all("ls => ls.map(l => l.dataset.rule)"))) for agent in names}
    rules = {agent: [r for r in found if not r.startswith("bandit/")] for agent, found in rules.items()}
    assert rules == {"qa_automation": ["test-failure"], "qa_performance_security": ["ruff/S307"],
                     "qa_strategy": ["todo-added", "untested-change"],
                     "appsec": ["detect-secrets/AWSKeyDetector", "detect-secrets/KeywordDetector",
                                "ruff/S602"]}
    appsec = agents.locator("tr[data-agent=appsec]").inner_text()
    assert "src/sample/settings.py:3" in appsec and "/ 8 MiB" in appsec
    served = httpx.get(f"{daemon.url}/gate/{gate_id}", headers=daemon.headers).json()
    assert (served["base"], served["head"], served["exitCode"]) == (base, head, 1)  # what the page showed
    assert f"head {head[:8]}" in page.get_by_test_id("gate-head-line").inner_text()
    screenshot(page, "gate-run-verdicts", full_page=True)
    page.locator("#nav").get_by_role("link", name="Gate runs").click()
    run = page.locator(f"tr[data-gate='{gate_id}']")
    run.wait_for()
    expect(run.locator("td").nth(1)).to_have_text("1")  # exit code 1: gates failed
    views_in_both_themes(page, "hopline-gate", [("gates", "[data-testid=gate-runs] tr[data-gate]"),
                                                 (f"gate/{gate_id}", "[data-testid=gate-result][data-exit]")])
    no_token_leaked(watched_page, daemon)


def test_a_file_attached_in_the_page_reaches_the_agent(hopline_daemon: Daemon, tmp_path: Path,
                                                       watched_page: PageWatch) -> None:
    """Attach a text file to a prompt: it goes as an embedded resource block (hopline's agent takes
    embedded context), which the agent echoes into the session's history with its text."""
    page = watched_page.page
    daemon = hopline_daemon
    page.goto(daemon.signed_in_console_url)
    page.get_by_test_id("sessions").wait_for()
    (tmp_path / "ws").mkdir()
    note = tmp_path / "note.txt"
    note.write_text("ATTACHED-IN-THE-PAGE 3141\n")
    session_id = create_session(page, str(tmp_path / "ws"), mode="auto",
                                scripted='{"iterations": 1, "toolsPerIteration": 1}')
    expect(page.get_by_test_id("send")).to_be_enabled(timeout=WAIT_MS)
    page.get_by_test_id("prompt-attach").set_input_files(str(note))
    send(page, "read the note")
    turn_ends(page, 1)
    page_json = httpx.get(f"{daemon.url}/session/{session_id}/transcript", headers=daemon.headers).json()
    echoed = [e["data"]["update"]["content"] for e in page_json["events"] if e["type"] == "session_update"
              and e["data"]["update"]["sessionUpdate"] == "user_message_chunk"]
    assert echoed[0] == {"type": "text", "text": "read the note"}
    assert echoed[1]["type"] == "resource" and echoed[1]["resource"]["text"] == "ATTACHED-IN-THE-PAGE 3141\n"
    assert page.get_by_test_id("prompt-attach").input_value() == ""  # cleared once sent


def test_a_finished_fix_run_shows_every_round_and_the_verified_fix(hopline_daemon: Daemon, tmp_path: Path,
                                                                   watched_page: PageWatch) -> None:
    """A --fix run read back after its end: round 1's findings, the fix commit and its verification,
    round 2's verdicts; the page spells no event type (it reads GET /gate/vocabulary)."""
    from hopline.scripted.sample_pull_request import make_sample_pull_request

    repo, _, _ = make_sample_pull_request(tmp_path / "pr", log_bytes=4096, logs=1)
    daemon = hopline_daemon
    started = httpx.post(f"{daemon.url}/gate", headers=daemon.headers, timeout=60,
                         json={"repo": str(repo), "fix": True, "agents": ["appsec", "qa_automation"]})
    assert started.status_code == 202, started.text
    gate_id = started.json()["gateId"]

    async def ended() -> dict[str, Any]:  # the run's stream, read to its end (the page reads it back)
        from hopline.client import DaemonClient

        async with DaemonClient(daemon.url, daemon.token) as client:
            async for event in client.gate_events(gate_id):
                if event.type == "gate_complete":
                    return dict(event.data["result"])
        raise AssertionError("the stream ended before gate_complete")

    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        result = pool.submit(asyncio.run, ended()).result(timeout=600)
    assert result["exitCode"] == 0, result.get("devTurns")
    page = watched_page.page
    page.goto(daemon.signed_in_console_url)
    page.locator("#nav").get_by_role("link", name="Gate runs").click()
    page.locator(f"tr[data-gate='{gate_id}'] a").click()
    expect(page.get_by_test_id("gate-result")).to_have_text(re.compile(r"^done · exit 0"), timeout=WAIT_MS)
    rounds = page.locator("[data-testid=gate-agents] [data-round]")
    expect(rounds).to_have_count(2)
    first = rounds.nth(0)
    assert first.locator("tr[data-agent=appsec]").get_attribute("data-verdict") == "fail"
    assert "detect-secrets/AWSKeyDetector" in first.locator("tr[data-agent=appsec]").inner_text()
    assert rounds.nth(1).locator("tr[data-agent=appsec]").get_attribute("data-verdict") == "pass"
    fix = page.get_by_test_id("gate-fix")
    expect(fix).to_have_count(1)
    assert fix.get_attribute("data-ok") == "true" and "verified: the fix builds" in fix.inner_text()
    assert "sandbox: " in page.get_by_test_id("gate-sandbox").inner_text()
    source = httpx.get(f"{daemon.url}/ui/js/views/gates.js", headers=daemon.headers).text
    assert "'gate_round'" not in source and "'gate_verdict'" not in source
    no_token_leaked(watched_page, daemon)
