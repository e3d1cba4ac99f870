"""`hopline serve`: the daemon with the gateway embedded (SPEC C-2, D-1..D-7)."""

from __future__ import annotations

import typer

from hopline.cli._common import bind_or_exit, budget_or_exit, require_coherent_or_exit
from hopline.vocabulary import AGENT_ENV, DATA_DIR_ENV, INTERNAL_TOKEN_ENV, SERVER_TOKEN_ENV


def event_loop_kind() -> dict[str, str]:
    """The event loop and HTTP parser ``loop="auto"`` / ``http="auto"`` give on this platform."""
    import importlib.util

    return {"loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
            "http": "httptools" if importlib.util.find_spec("httptools") else "h11"}


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
        port: int = typer.Option(0, help="Port to bind; 0 picks a free one (the URL is printed)."),
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
        import logging
        import math
        import os
        import secrets
        import shlex
        import socket
        import sqlite3
        import sys
        from pathlib import Path

        budget = budget_or_exit()
        # `hopline demo --naive` serves the seed's incoherent 100 KB gateway limit on purpose.
        naive = require_coherent_or_exit(budget, "serve")

        import uvicorn

        from hopline.budget import HOP_DAEMON_API
        from hopline.cli._http_server import freeze_startup_heap, uvicorn_config
        from hopline.console import CONSOLE_PREFIX
        from hopline.daemon.app import create_daemon_app
        from hopline.daemon.child import agent_env_names
        from hopline.logs import configure_json_logging

        try:
            passed_env = agent_env_names([os.environ.get(AGENT_ENV, ""), *agent_env])
        except ValueError as exc:
            print(f"hopline serve: bad setting: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None
        for name in passed_env:
            if name not in os.environ:
                print(f"hopline serve: warning: {AGENT_ENV} names {name}, which is not set", file=sys.stderr)
        configure_json_logging()
        argv = shlex.split(agent_cmd) if agent_cmd.strip() else [sys.executable, "-m", "hopline", "agent"]
        if data_dir:
            root = Path(data_dir)
        elif os.environ.get(DATA_DIR_ENV):
            root = Path(os.environ[DATA_DIR_ENV])
        else:
            root = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "hopline"
        sock = bind_or_exit(host, port, "serve")  # a busy port is said before a token is printed
        server_token = os.environ.get(SERVER_TOKEN_ENV, "")
        generated_token = not server_token
        if generated_token:
            server_token = secrets.token_urlsafe(32)
            print(f"{SERVER_TOKEN_ENV}={server_token}", flush=True)
        internal_token = os.environ.get(INTERNAL_TOKEN_ENV) or secrets.token_urlsafe(32)

        bound_port = sock.getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        url = f"http://{url_host}:{bound_port}"

        from hopline.budget import Settings
        from hopline.gateway.providers import ProviderSettingError
        from hopline.store.locations import StoreSettingError
        from hopline.store.postgres import StoreUnavailable

        try:
            daemon = create_daemon_app(budget, data_dir=root, agent_cmd=argv, server_token=server_token,
                                       internal_token=internal_token, gateway_url=url, allow_incoherent=naive,
                                       agent_env=passed_env, settings=Settings.from_env(store_url=store),
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

        class DaemonServer(uvicorn.Server):
            async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
                # End the open SSE streams first: uvicorn waits for open responses before the
                # lifespan shutdown, and a stream only ends when its subscriber is closed.
                daemon.state.bus.close_all()
                await super().shutdown(sockets)

        # uvloop (uvicorn[standard]) when it imports, else asyncio's loop; httptools with the request
        # head deadline and the connection ceiling (cli/_http_server.py), else h11 without them.
        config = uvicorn_config(daemon, budget, HOP_DAEMON_API, loop="auto",
                                timeout_graceful_shutdown=math.ceil(budget.serve_stop_grace_seconds))
        server = DaemonServer(config)
        # The fragment never reaches the server (nor its logs); the page moves it to sessionStorage.
        console_url = f"{url}{CONSOLE_PREFIX}/" + (f"#token={server_token}" if generated_token else "")
        print(f"console: {console_url}", flush=True)
        print(f"hopline serve listening on {url}", flush=True)
        logging.getLogger("hopline.daemon").info("listening", extra={"port": bound_port, **event_loop_kind()})
        freeze_startup_heap()
        server.run(sockets=[sock])  # on the loop config.loop picks
