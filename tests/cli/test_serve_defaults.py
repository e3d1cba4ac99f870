"""`hopline serve` as a person starts it: one daemon per data directory, a fixed default port, and the
token told on a terminal (the two `export` lines) or kept in a 0600 file elsewhere."""

from __future__ import annotations

import contextlib
import errno
import os
import pty
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from daemon.support import Daemon, running_daemon, start_daemon, stop_daemon_proc

pytestmark = pytest.mark.e2e  # every test here starts real processes

SERVE = [sys.executable, "-m", "hopline", "serve"]


def serve_once(data_dir: Path, *args: str,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`hopline serve` expected to refuse: it must exit on its own."""
    full_env = {**os.environ, "HOPLINE_SERVER_TOKEN": "a-second-token", **(env or {})}
    return subprocess.run([*SERVE, "--data-dir", str(data_dir), *args], env=full_env, capture_output=True,
                          text=True, timeout=60)


def assert_healthy(daemon: Daemon) -> None:
    status = httpx.get(daemon.url + "/daemon/status", headers=daemon.headers, timeout=10)
    assert status.status_code == 200


def test_a_second_daemon_on_the_same_data_directory_is_refused_naming_the_first(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as first:
        created = httpx.post(first.url + "/session", json={"cwd": str(tmp_path)}, headers=first.headers,
                             timeout=30)
        assert created.status_code == 200
        second = serve_once(first.data_dir, "--port", "0")
        assert second.returncode == 1, second.stderr
        assert (f"another hopline daemon (pid {first.proc.pid}, {first.url}) is serving the data "
                f"directory {first.data_dir}") in second.stderr
        assert "listening" not in second.stdout
        # the first goes on untouched: its session still takes a prompt and ends it
        session_id = created.json()["sessionId"]
        prompt = httpx.post(f"{first.url}/session/{session_id}/prompt", json={"text": "hello"},
                            headers=first.headers, timeout=30)
        assert prompt.status_code == 202
        assert_healthy(first)
        # another directory is another daemon's
        with running_daemon(tmp_path, data_dir=tmp_path / "other", log_name="other.log") as other:
            assert_healthy(other)


def test_a_lock_left_by_a_killed_daemon_is_free_at_once(tmp_path: Path) -> None:
    first = start_daemon(tmp_path)
    children = psutil.Process(first.proc.pid).children(recursive=True)
    try:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        for child in children:  # its agent children (the warm pool) outlive a SIGKILL: ours to stop
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    assert (first.data_dir / "daemon.lock").exists()  # the file stays; its lock went with the process
    with running_daemon(tmp_path, data_dir=first.data_dir, log_name="again.log") as again:
        assert_healthy(again)


def test_store_repair_waits_for_the_daemon_that_serves_the_directory(tmp_path: Path) -> None:
    def store_check(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hopline", "store", "check", "--data-dir", str(data_dir),
                               *args], capture_output=True, text=True, timeout=60)

    with running_daemon(tmp_path) as daemon:
        assert store_check(daemon.data_dir).returncode == 0  # reading alongside it is fine
        refused = store_check(daemon.data_dir, "--repair")
        assert refused.returncode == 2
        assert (f"a hopline daemon (pid {daemon.proc.pid}, {daemon.url}) is serving {daemon.data_dir}; "
                "stop it first") in refused.stderr
    assert store_check(daemon.data_dir, "--repair").returncode == 0


def test_each_daemon_of_a_shared_postgresql_store_still_locks_its_own_directory(tmp_path: Path,
                                                                               pg_url: str) -> None:
    env = {"HOPLINE_STORE_URL": pg_url, "HOPLINE_CLUSTER_TOKEN": "cluster-token-for-the-lock-test",
           "HOPLINE_WARM_CHILDREN": "0"}
    with running_daemon(tmp_path, env=env) as first:
        second = serve_once(first.data_dir, "--port", "0", env=env)
        assert second.returncode == 1, second.stderr
        assert f"(pid {first.proc.pid}, {first.url})" in second.stderr
        assert_healthy(first)


@contextlib.contextmanager
def listening_on(port: int) -> Iterator[None]:
    """Hold ``127.0.0.1:port`` listening; if something else already does, it is busy all the same."""
    sock = socket.socket()
    try:
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
        yield
    finally:
        sock.close()


def test_serve_listens_on_port_8765_by_default(tmp_path: Path) -> None:
    """8765 busy (held here): `serve` with no --port says so, and how to pick another."""
    with listening_on(8765):
        result = serve_once(tmp_path / "data")
    assert result.returncode == 1
    assert "cannot bind 127.0.0.1:8765: Address already in use" in result.stderr
    assert "--port" in result.stderr


def read_until(fd: int, marker: bytes, deadline: float) -> bytes:
    out = b""
    while marker not in out:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} in time: {out[-2000:]!r}")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                break
    return out


def test_on_a_terminal_serve_prints_the_exports_a_client_shell_takes(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "HOPLINE_SERVER_TOKEN"}
    main_fd, child_fd = pty.openpty()
    data = tmp_path / "data"
    proc = subprocess.Popen([*SERVE, "--port", "0", "--data-dir", str(data)], env=env, stdin=child_fd,
                            stdout=child_fd, stderr=subprocess.DEVNULL, close_fds=True)
    os.close(child_fd)
    try:
        text = read_until(main_fd, b"listening on", time.monotonic() + 60).decode().replace("\r\n", "\n")
    finally:
        stop_daemon_proc(proc)
        os.close(main_fd)
    lines = text.splitlines()
    url = lines[-1].rsplit(" ", 1)[1]
    token = (data / "server-token").read_text().strip()
    assert lines == [f"export HOPLINE_URL={url}", f"export HOPLINE_SERVER_TOKEN={token}",
                     f"console: {url}/ui/#token={token}", f"hopline serve listening on {url}"]


def test_off_a_terminal_the_token_is_in_a_0600_file_used_again_by_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_daemon(tmp_path, token="", data_dir=data) as first:
        token_file = data / "server-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert first.stdout_lines[0] == (f"token: in {token_file} (mode 0600; a client takes it with "
                                         f'export HOPLINE_SERVER_TOKEN="$(cat {token_file})")')
        assert not [line for line in first.stdout_lines if first.token in line]
        assert first.token not in first.log_text()
        assert httpx.get(first.url + "/daemon/status", timeout=10).status_code == 401
        assert_healthy(first)
    with running_daemon(tmp_path, token="", data_dir=data, log_name="again.log") as again:
        assert again.token == first.token  # a client's exported token stays good across a restart
        assert_healthy(again)
    token_file.chmod(0o644)  # readable by others: never used again
    with running_daemon(tmp_path, token="", data_dir=data, log_name="third.log") as third:
        assert third.token != first.token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert_healthy(third)
