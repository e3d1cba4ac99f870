"""`hopline serve`: the daemon with the gateway embedded (SPEC C-2, D-1..D-7)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from hopline.budget import AGENT_ENV, DATA_DIR_ENV, INTERNAL_TOKEN_ENV, SERVER_TOKEN_ENV, URL_ENV
from hopline.cli._common import bind_or_exit, budget_or_exit, require_coherent_or_exit
from hopline.compiled import STATE as COMPILED

if TYPE_CHECKING:
    import socket
    from pathlib import Path

    from hopline.budget import Budget

# A fixed default, so that a client's HOPLINE_URL stays right from one start to the next (uvicorn's
# 8000 and the usual 8080 are taken by too many other servers).
DEFAULT_PORT = 8765
# The token `serve` makes when HOPLINE_SERVER_TOKEN is not set: kept in the data directory, mode 0600,
# and used again by the next start, so a client's exported token stays good across restarts.
TOKEN_FILE = "server-token"


def event_loop_kind() -> dict[str, str]:
    """The event loop and HTTP parser ``loop="auto"`` / ``http="auto"`` give on this platform."""
    import importlib.util

    return {"loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
            "http": "httptools" if importlib.util.find_spec("httptools") else "h11"}


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
        port: int = typer.Option(DEFAULT_PORT, help="Port to bind; 0 picks a free one (the URL is printed)."),
        data_dir: str = typer.Option("", "--data-dir", help="Journal and agent session store "
                                     "(default: $HOPLINE_DATA_DIR or ~/.local/share/hopline)."),
        agent_cmd: str = typer.Option("", "--agent-cmd", help="ACP agent command for every session "
                                      "(default: this Python's `hopline agent`)."),
        agent_env: list[str] = typer.Option([], "--agent-env", metavar="NAME", help="Pass this variable of "
                                            "the daemon's environment to agent children (repeatable; also "
                                            "HOPLINE_AGENT_ENV=NAME,NAME), e.g. a third-party agent's "
                                            "provider key. Nothing else but a safe base reaches them."),
        store: str = typer.Option("", "--store", metavar="URL", help="Where the journal, sessions, leases "
                                  "and sidecar index live: sqlite:///PATH (default: under --data-dir) or "
                                  "postgresql://USER:PASS@HOST:PORT/DB to be one of several daemons "
                                  "(also HOPLINE_STORE_URL; see `hopline limits`)."),
    ) -> None:
        """Serve the daemon API and SSE events; each session runs its own ACP agent child."""
        run_serve(host=host, port=port, data_dir=data_dir, agent_cmd=agent_cmd, agent_env=agent_env,
                  store=store)


def run_serve(*, host: str, port: int, data_dir: str, agent_cmd: str, agent_env: list[str],
              store: str) -> None:
    """`hopline serve`'s work: the settings checked (each bad one exits 2 with one line), the
    socket bound before a token is printed, the daemon app built, then served until stopped."""
    import os
    import secrets
    import shlex
    import sys

    budget = budget_or_exit()
    # `hopline demo --naive` serves the incident's incoherent 100 KB gateway limit on purpose (K-5).
    naive = require_coherent_or_exit(budget, "serve", show_warnings=True)

    from hopline.logs import configure_json_logging

    passed_env = _agent_env_or_exit(agent_env)
    configure_json_logging()
    argv = shlex.split(agent_cmd) if agent_cmd.strip() else [sys.executable, "-m", "hopline", "agent"]
    root = _data_root(data_dir)
    lock = _lock_or_exit(root)  # before the port: a second daemon on this directory is told which one
    sock = bind_or_exit(host, port, "serve")  # a busy port is said before a token is printed
    server_token, token_file = _server_token(root)
    internal_token = os.environ.get(INTERNAL_TOKEN_ENV) or secrets.token_urlsafe(32)

    bound_port = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    url = f"http://{url_host}:{bound_port}"
    lock.publish(url)
    daemon = _daemon_app_or_exit(budget, sock, root, agent_cmd=argv, server_token=server_token,
                                 internal_token=internal_token, url=url, naive=naive, agent_env=passed_env,
                                 store=store)
    for line in announcement(url, server_token, token_file, tty=sys.stdout.isatty()):
        print(line, flush=True)
    _serve_daemon(daemon, budget, sock)


def announcement(url: str, token: str, token_file: Path | None, *, tty: bool) -> list[str]:
    """What `serve` prints once it listens. On a terminal: the two lines a client's shell takes
    (``export HOPLINE_URL=...``, and the token when `serve` made it) and the console's URL carrying
    that token in its fragment. Elsewhere (a service's journal) never the token: the file holding it.
    The last line names the URL (``hopline serve listening on URL``; the embedded stack reads it)."""
    import shlex

    from hopline.console import CONSOLE_PREFIX

    console = f"{url}{CONSOLE_PREFIX}/"
    lines = [f"export {URL_ENV}={url}"] if tty else []
    if token_file is None:  # the operator's own token: they have it
        lines.append(f"console: {console}")
    elif tty:
        # The fragment never reaches the server (nor its logs); the page moves it to sessionStorage.
        lines += [f"export {SERVER_TOKEN_ENV}={token}", f"console: {console}#token={token}"]
    else:
        where = shlex.quote(str(token_file))
        lines += [f"token: in {where} (mode 0600; a client takes it with "
                  f'export {SERVER_TOKEN_ENV}="$(cat {where})")',
                  f"console: {console}"]
    return [*lines, f"hopline serve listening on {url}"]


def _lock_or_exit(root: Path) -> Any:
    """The data directory's lock (:mod:`hopline.store.dir_lock`), or exit 1 naming its holder."""
    import sys

    from hopline.errors import DataDirBusy
    from hopline.store.dir_lock import DataDirLock

    try:
        return DataDirLock.acquire(root)
    except DataDirBusy as exc:
        print(f"hopline serve: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    except OSError as exc:
        print(f"hopline serve: cannot lock the data directory {root}: {exc.strerror}", file=sys.stderr)
        raise typer.Exit(1) from None


def _server_token(root: Path) -> tuple[str, Path | None]:
    """``$HOPLINE_SERVER_TOKEN`` (and no file), else the token of the data directory's 0600 file:
    the one a previous start wrote, or a new one written there."""
    import os
    import re
    import secrets
    import stat

    given = os.environ.get(SERVER_TOKEN_ENV)
    if given:
        return given, None
    path = root / TOKEN_FILE
    try:
        info = os.lstat(path)
        # Used again only when it is ours alone: a regular file of this user, mode 0600 or narrower.
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
            with open(path, "rb") as file:
                kept = file.read(256).decode("ascii", "replace").strip()
            if re.fullmatch(r"[A-Za-z0-9_\-]{32,128}", kept):
                return kept, path
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    staged = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, f"{token}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(staged, path)
    return token, path


def _agent_env_or_exit(agent_env: list[str]) -> tuple[str, ...]:
    """The variables passed to agent children (``--agent-env`` and ``HOPLINE_AGENT_ENV``); a bad
    name exits 2, one that is not set is warned about."""
    import os
    import sys

    from hopline.daemon.child import agent_env_names

    try:
        passed_env = agent_env_names([os.environ.get(AGENT_ENV, ""), *agent_env])
    except ValueError as exc:
        print(f"hopline serve: bad setting: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    for name in passed_env:
        if name not in os.environ:
            print(f"hopline serve: warning: {AGENT_ENV} names {name}, which is not set", file=sys.stderr)
    return passed_env


def _data_root(data_dir: str) -> Path:
    """``--data-dir``, else ``$HOPLINE_DATA_DIR``, else ``$XDG_DATA_HOME/hopline`` (or ~/.local/share)."""
    import os
    from pathlib import Path

    if data_dir:
        return Path(data_dir)
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "hopline"


def _daemon_app_or_exit(budget: Budget, sock: socket.socket, root: Path, *, agent_cmd: list[str],
                        server_token: str, internal_token: str, url: str, naive: bool,
                        agent_env: tuple[str, ...], store: str) -> Any:
    """The daemon app; a bad setting exits 2, a store that is away or a store file that cannot be
    used exits 1, each with one line (and the socket closed)."""
    import sqlite3
    import sys

    from hopline.budget import Settings
    from hopline.daemon.app import create_daemon_app
    from hopline.errors import ProviderSettingError, StoreSettingError, StoreUnavailable

    try:
        return create_daemon_app(budget, data_dir=root, agent_cmd=agent_cmd, server_token=server_token,
                                 internal_token=internal_token, gateway_url=url, allow_incoherent=naive,
                                 agent_env=agent_env, settings=Settings.from_env(store_url=store),
                                 listen_url=url)
    except (ProviderSettingError, StoreSettingError) as exc:
        sock.close()
        print(f"hopline serve: bad setting: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except StoreUnavailable as exc:
        sock.close()
        print(f"hopline serve: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (sqlite3.DatabaseError, OSError) as exc:  # a store file that cannot be opened: one line
        sock.close()
        print(f"hopline serve: a store file under {root} cannot be used ({type(exc).__name__}: {exc}). "
              f"Next: run `hopline store check --data-dir {root}`", file=sys.stderr)
        raise typer.Exit(1) from None


def _serve_daemon(daemon: Any, budget: Budget, sock: socket.socket) -> None:
    """Serve ``daemon`` on ``sock`` until stopped."""
    import logging
    import math

    import uvicorn

    from hopline.budget import HOP_DAEMON_API
    from hopline.http.server import prepare_daemon_process, uvicorn_config

    class DaemonServer(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # End the open SSE streams first: uvicorn waits for open responses before the
            # lifespan shutdown, and a stream only ends when its subscriber is closed.
            daemon.state.bus.close_all()
            await super().shutdown(sockets)

    # uvloop (uvicorn[standard]) when it imports, else asyncio's loop; httptools with the request
    # head deadline and the connection ceiling (http/server.py), else h11 without them.
    config = uvicorn_config(daemon, budget, HOP_DAEMON_API, loop="auto",
                            timeout_graceful_shutdown=math.ceil(budget.serve_stop_grace_seconds))
    server = DaemonServer(config)
    bound_port = sock.getsockname()[1]
    logging.getLogger("hopline.daemon").info("listening", extra={"port": bound_port, **event_loop_kind(),
                                                                 "compiled": COMPILED.state})
    prepare_daemon_process()
    server.run(sockets=[sock])  # on the loop config.loop picks
