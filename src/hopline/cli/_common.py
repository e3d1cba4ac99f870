"""Helpers shared by the commands: reading the budget with a clear startup error."""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import typer

from hopline.budget import (
    NAIVE_ENV,
    SERVER_TOKEN_ENV,
    URL_ENV,
    Budget,
    BudgetError,
    IncoherentBudget,
    environment_warnings,
    require_coherent,
)

T = TypeVar("T")


def run_client(command: str, main: Coroutine[Any, Any, T]) -> T:
    """Run a command that talks to a daemon: a daemon, stream or stack failure exits 2 naming the hop
    (the error's own message), Ctrl-C exits 130."""
    import asyncio

    from hopline.client import DaemonError, SseEventTooLarge, SseReconnectExhausted
    from hopline.errors import EmbeddedStackError

    try:
        return asyncio.run(main)
    except (DaemonError, SseEventTooLarge, SseReconnectExhausted, EmbeddedStackError) as exc:
        print(f"hopline {command}: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def daemon_target(url: str | None, token: str | None) -> tuple[str | None, str | None]:
    """The daemon a client command talks to: ``--url``, else ``$HOPLINE_URL`` (None: neither, the
    command's default applies); its token: ``--token``, else ``$HOPLINE_SERVER_TOKEN``."""
    target = url or os.environ.get(URL_ENV) or None
    return target, (token if token is not None else os.environ.get(SERVER_TOKEN_ENV))


def budget_or_exit() -> Budget:
    """The budget from the environment; a bad setting exits 2 with the variable named. A variable
    hopline ignores although it looks like its own (a fixed value's name, a typo) is warned about."""
    for warning in environment_warnings(os.environ):
        print(f"hopline: warning: {warning}", file=sys.stderr)
    try:
        return Budget.from_env()
    except BudgetError as exc:
        print(f"hopline: bad setting: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None

# `HOPLINE_NAIVE=1` replays the original incident on purpose (K-5: content-only estimate, no
# transport bound, an implicit 100 KB gateway limit). Only then is an incoherent chain reported and
# run anyway; outside naive mode an incoherent chain refuses to start.
# The replayed gateway limit: Express's implicit `100kb`.
NAIVE_GATEWAY_LIMIT = "100kb"


def naive_requested(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(NAIVE_ENV) == "1"


def require_coherent_or_exit(budget: Budget, command: str, *, show_warnings: bool = False) -> bool:
    """Print each coherence error and exit 2, unless naive mode runs it on purpose; with
    ``show_warnings``, print each warning too (a server says them once at start-up).

    Returns whether naive mode is on.
    """
    naive = naive_requested()
    try:
        for warning in require_coherent(budget):
            if show_warnings:
                print(f"hopline {command}: warning {warning.rule}: {warning.message}", file=sys.stderr)
    except IncoherentBudget as exc:
        for finding in exc.errors:
            print(f"hopline {command}: incoherent budget: {finding.rule}: {finding.message}", file=sys.stderr)
        if not naive:
            raise typer.Exit(2) from None
        print(f"hopline {command}: {NAIVE_ENV}=1: running the incoherent budget on purpose", file=sys.stderr)
    return naive


def bind_or_exit(host: str, port: int, command: str) -> socket.socket:
    """A socket bound to ``host:port`` (port 0 picks one), or exit 1 naming the address."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            hint = " (another program listens there: pass --port N, or --port 0 for a free one)"
        print(f"hopline {command}: cannot bind {host}:{port}: {exc.strerror}{hint}", file=sys.stderr)
        raise typer.Exit(1) from None
    return sock
