"""The console's server side on a real `hopline serve`: the static files and their CSP, the printed
console URL, ``GET /daemon/frames`` and the sessions' ``lostBytes`` (no browser here)."""

from __future__ import annotations

import html.parser
import socket
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path

import httpx
import pytest

from daemon.support import BIG_AGENT_CMD, Daemon, running_daemon
from hopline.budget import Budget
from hopline.client import DaemonClient
from hopline.console import CONTENT_SECURITY_POLICY
from hopline.console.routes import STATIC_DIR
from hopline.observe.pipe_histogram import bucket_boundaries

TOKEN = "console-test-token-5d1e"
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("console"), token=TOKEN) as d:
        yield d


def static_files() -> list[str]:
    return sorted(str(p.relative_to(STATIC_DIR)) for p in STATIC_DIR.rglob("*") if p.is_file())


class _Markup(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, _ in attrs:
            if name.startswith("on") or name == "style":
                self.inline.append(f"<{tag} {name}>")
        if tag == "script":
            self.scripts.append(dict(attrs))
            self._in_script = True

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append("inline <script> body")


@pytest.mark.e2e
def test_every_console_file_is_served_without_a_token_and_with_the_csp(daemon: Daemon) -> None:
    files = static_files()
    assert {"index.html", "console.css", "js/app.js", "js/sse.js", "js/sidecars.js"} <= set(files)
    with httpx.Client(base_url=daemon.url, timeout=10) as anonymous:
        for name in files:
            response = anonymous.get(f"/ui/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["referrer-policy"] == "no-referrer"
            assert response.content == (STATIC_DIR / name).read_bytes()
            if name.endswith(".js"):  # ES modules load only with a JavaScript media type
                assert response.headers["content-type"].startswith("text/javascript"), name
        index = anonymous.get("/ui/")
        assert index.text == (STATIC_DIR / "index.html").read_text()
        redirect = anonymous.get("/ui", follow_redirects=False)
        assert redirect.status_code == 308 and redirect.headers["location"] == "/ui/"
        # the API behind it still needs the token
        assert anonymous.get("/daemon/frames").status_code == 401


def test_the_csp_allows_no_inline_script_nor_other_origins() -> None:
    directives = dict(d.split(" ", 1) for d in CONTENT_SECURITY_POLICY.split("; "))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY and "http" not in CONTENT_SECURITY_POLICY
    markup = _Markup()
    markup.feed((STATIC_DIR / "index.html").read_text())
    assert markup.inline == []
    assert markup.scripts == [{"type": "module", "src": "js/app.js"}]
    for path in STATIC_DIR.rglob("*.js"):
        source = path.read_text().replace(SVG_NAMESPACE, "")  # a name, not a place to load from
        # Data goes into the page as text, never as markup or code; nothing is loaded from elsewhere.
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "new Function",
                       "document.write", "http://", "https://"):
            assert banned not in source, (path.name, banned)
        # Only the one module reads the sidecar entries of `_meta`.
        if path.name != "sidecars.js":
            assert "hopline.sidecar" not in source, path.name
        # The token never goes in a URL: one module reads the fragment and sets the header.
        if path.name != "api.js":
            assert "token=" not in source and "'Authorization'" not in source, path.name


def _raw_get(daemon: Daemon, target: str, method: str = "GET") -> tuple[int, bytes]:
    host, port = daemon.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@pytest.mark.parametrize(("method", "target", "status"), [
    ("GET", "/ui/../../pyproject.toml", 404),
    ("GET", "/ui/../daemon/status", 404),
    ("GET", "/ui/nope.js", 404),
    ("GET", "/ui/js/", 404),
    ("GET", "/ui/%00", 404),
    ("POST", "/ui/", 405),
    ("DELETE", "/ui/index.html", 405),
])
@pytest.mark.e2e
def test_bad_console_requests_get_a_4xx_naming_the_hop(daemon: Daemon, method: str, target: str,
                                                       status: int) -> None:
    got, body = _raw_get(daemon, target, method)
    assert got == status, body
    assert b'"hop":"daemon.api"' in body and b"console" in body


@pytest.mark.e2e
def test_serve_off_a_terminal_prints_the_console_url_without_the_token(tmp_path: Path) -> None:
    """Off a terminal (a service's journal) the URL never carries the token, not even one `serve` made;
    that one is in the data directory's 0600 file (on a terminal: tests/cli/test_serve_defaults.py)."""
    with running_daemon(tmp_path, token="", log_name="generated.log") as generated:
        assert generated.console_url == f"{generated.url}/ui/"
        assert not any(generated.token in line for line in generated.stdout_lines)
    with running_daemon(tmp_path, token=TOKEN, data_dir=tmp_path / "given", log_name="given.log") as given:
        assert given.console_url == f"{given.url}/ui/"
        assert not any(TOKEN in line for line in given.stdout_lines)
        assert TOKEN not in given.log_text()


async def _run_turn(client: DaemonClient, session_id: str, text: str) -> None:
    prompt_id = await client.prompt(session_id, text)
    async with aclosing(client.turn_events(session_id, prompt_id)) as events:
        async for event in events:
            if event.is_turn_end:
                assert event.type == "turn_complete", event.data


@pytest.mark.e2e
async def test_daemon_frames_has_the_histogram_the_lines_and_the_large_frame_records(
        tmp_path: Path) -> None:
    budget = Budget.defaults()
    with running_daemon(tmp_path, agent_cmd=BIG_AGENT_CMD, token=TOKEN) as daemon:
        async with DaemonClient(daemon.url, TOKEN) as client:
            session_id = await client.create_session(cwd=str(tmp_path))
            await _run_turn(client, session_id, "big 300000")  # one ~300 KB tool_call_update frame
            await _run_turn(client, session_id, "chunks 3 100")
            pipe = (await client.status())["runtime"]["perf"]["pipe"]
            frames = httpx.get(daemon.url + "/daemon/frames", headers=daemon.headers, timeout=10).json()
    histogram = frames["histogram"]
    assert histogram["name"] == "hopline.daemon.pipe.message_bytes" and histogram["unit"] == "By"
    assert histogram["boundaries"] == [int(b) for b in bucket_boundaries(budget)]
    for direction in ("inbound", "outbound"):
        counts = histogram["directions"][direction]["counts"]
        assert len(counts) == len(histogram["boundaries"]) + 1
        # the same registry as /metrics, and the same frames as the status counters
        assert sum(counts) == histogram["directions"][direction]["count"] == pipe[direction]["count"]
        assert histogram["directions"][direction]["sumBytes"] == pipe[direction]["totalBytes"]
    inbound = histogram["directions"]["inbound"]["counts"]
    index = histogram["boundaries"].index(1024 * 1024)  # (256 KiB, 1 MiB]
    assert inbound[index] == 1
    assert [(line["name"], line["bytes"]) for line in frames["lines"]] == [
        ("HOPLINE_PIPE_MAX_FRAME_BYTES", budget.pipe_max_frame_bytes),
        ("HOPLINE_SIDECAR_THRESHOLD_BYTES", budget.sidecar_threshold_bytes),
        ("LARGE_FRAME_THRESHOLD_BYTES", budget.large_frame_threshold_bytes)]
    large = frames["largeFrames"]
    assert (large["logged"], large["suppressed"], len(large["recent"])) == (1, 0, 1)
    record = large["recent"][0]
    assert record["direction"] == "inbound" and record["sourceClass"] == "session_update_notification"
    assert record["sessionUpdate"] == "tool_call_update" and record["maxContentTextBytes"] == 300_000
    assert record["bytes"] >= budget.large_frame_threshold_bytes and isinstance(record["atMs"], int)
    text = repr(frames)
    assert session_id not in text and str(tmp_path) not in text  # O-5: sizes and kinds only


@pytest.mark.e2e
async def test_lost_bytes_count_what_a_client_cannot_have(tmp_path: Path) -> None:
    """A zero is honest: with a sidecar object quota under the output, the preview goes out
    flagged as truncated and the session's lostBytes moves by exactly the bytes the preview does not
    carry (the field's size minus its head and tail, D-8)."""
    env = {"HOPLINE_SIDECAR_MAX_OBJECT_BYTES": "128kb", "HOPLINE_SIDECAR_MAX_SESSION_BYTES": "128kb"}
    with running_daemon(tmp_path, agent_cmd=BIG_AGENT_CMD, token=TOKEN, env=env) as daemon:
        async with DaemonClient(daemon.url, TOKEN) as client:
            session_id = await client.create_session(cwd=str(tmp_path))

            async def lost() -> int:
                row = next(s for s in (await client.status())["sessions"] if s["sessionId"] == session_id)
                return int(row["lostBytes"])

            await _run_turn(client, session_id, "big 100000")  # fits the quota: kept whole
            assert await lost() == 0
            await _run_turn(client, session_id, "big 200000")  # over it: only a preview
            assert await lost() == 200_000 - Budget.defaults().sidecar_preview_bytes

