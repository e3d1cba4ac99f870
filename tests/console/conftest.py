"""A real headless Chromium (the OS package, driven by Playwright), real `hopline serve` daemons on
127.0.0.1, a loopback TCP proxy that can drop connections, and screenshots saved as artifacts.

Chromium comes from the OS (`.ci/run` installs it when /usr/bin/chromium is missing). Outside CI a
machine without it skips the browser tests and says why; in CI (CI=true) that is a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# The flags the closed network here needs (without the background-networking ones Chromium's own
# connections are refused, many at a time).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("HOPLINE_TEST_ARTIFACTS") or Path(__file__).parents[1] / "artifacts")
ARTIFACTS = ARTIFACTS / "console"
VIEWPORT = {"width": 1280, "height": 860}
_saved: list[Path] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _saved:
        terminalreporter.write_line(f"console screenshots ({len(_saved)}): {ARTIFACTS}")


def screenshot(page: Any, name: str, *, full_page: bool = False) -> Path:
    """Saves one screenshot of the page as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.mouse.move(0, VIEWPORT["height"] - 1)  # no hover state in the picture
    page.screenshot(path=str(path), full_page=full_page)
    _saved.append(path)
    return path


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: `apt-get install -y chromium` (.ci/run does it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    user_data = Path(tempfile.mkdtemp(prefix="hopline-chromium-"))  # a fresh profile every run
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(user_data), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport=VIEWPORT, accept_downloads=True)
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(user_data, ignore_errors=True)


class PageWatch:
    """Every console error, page error and request URL of one page (with its request headers)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.allowed: list[re.Pattern[str]] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("request", lambda r: self.requests.append((r.url, dict(r.headers))))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console.{message.type}: {message.text}")

    def unexpected_errors(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]


@pytest.fixture
def watched_page(browser_context: Any) -> Iterator[PageWatch]:
    """A new tab; the test fails on any JavaScript console error in it."""
    page = browser_context.new_page()
    watch = PageWatch(page)
    try:
        yield watch
    finally:
        page.close()
    assert watch.unexpected_errors() == [], "JavaScript console errors"


class DroppingProxy:
    """A loopback TCP proxy whose connections the test can cut, and whose new connections it can
    hold (accepted but not forwarded) until released: a dropped network, as a browser sees one."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.writers: set[asyncio.StreamWriter] = set()
        self.open = asyncio.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.server: asyncio.Server | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.open.set()
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.writers.add(client_writer)
        await self.open.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.close()
            return
        self.writers.add(up_writer)
        await asyncio.gather(self._pipe(client_reader, up_writer), self._pipe(up_reader, client_writer))
        self.writers.discard(client_writer)
        self.writers.discard(up_writer)

    def _call(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait(10)

    def hold_and_cut(self) -> None:
        """Hold new connections, and cut every open one (both sides, at once)."""
        def cut() -> None:
            self.open.clear()
            for writer in list(self.writers):
                writer.transport.abort()
            self.writers.clear()

        self._call(cut)

    def release(self) -> None:
        self._call(self.open.set)

    def __enter__(self) -> DroppingProxy:
        self.thread.start()
        self.ready.wait(10)
        return self

    async def _stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
