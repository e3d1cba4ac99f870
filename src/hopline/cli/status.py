"""`hopline status`: a running daemon's ``GET /daemon/status`` as tables (SPEC C-2, O-1)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import typer

from hopline.budget import SERVER_TOKEN_ENV, URL_ENV
from hopline.cli._common import budget_or_exit, daemon_target

if TYPE_CHECKING:
    from rich.console import Console

    from hopline.client import DaemonStatus


def exact_size(value: Any) -> str:
    """A byte count exactly, with human units beside it from 1 KiB up: ``10485760 (10 MiB)``."""
    from hopline.budget import format_size

    if isinstance(value, bool) or not isinstance(value, int):
        return "-" if value is None else str(value)
    return f"{value} ({format_size(value)})" if value >= 1024 else str(value)


def _kv_table(title: str, rows: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in rows.items():
        shown = exact_size(value) if "ytes" in key or key == "bytes" else _plain(value)
        table.add_row(key, shown)
    return table


def _plain(value: Any) -> str:
    if isinstance(value, dict | list):
        import orjson

        return orjson.dumps(value).decode()[:200]
    return str(value)


SHORT_ID_CHARS = 8  # a display bound: enough to tell the sessions of one daemon apart


def short_id(value: Any) -> str:
    """A session id's first characters, to tie a row to a session (the whole id is in ``--json``)."""
    return f"{value[:SHORT_ID_CHARS]}…" if isinstance(value, str) and value else "-"


def print_status(console: Console, status: Mapping[str, Any]) -> None:
    """The status object as tables, one per part, in the order an operator reads them."""
    _print_sessions(console, status)
    _print_gate_runs(console, status)
    _print_pipe(console, status)
    _print_other_counters(console, status)
    _print_cluster(console, status)
    _print_budget(console, status)


def _print_sessions(console: Console, status: Mapping[str, Any]) -> None:
    """The sessions, one row each (the id short, no path; the hostile-child counters when set)."""
    from rich.table import Table

    sessions = status.get("sessions")
    if isinstance(sessions, dict):
        console.print(_kv_table("sessions", sessions))
    elif isinstance(sessions, list):
        table = Table(title=f"sessions ({len(sessions)})", title_justify="left")
        keys: list[str] = []
        for s in sessions:
            for k in s if isinstance(s, dict) else ():
                if k not in keys and k not in ("id", "sessionId", "cwd"):  # the id is shown short; no path
                    keys.append(k)
        # the hostile-child counters only when one is set (the table stays readable)
        quiet = ("pendingPermissionBytes", "refusedRequests", "agentNotReading")
        keys = [k for k in keys if k not in quiet
                or any(isinstance(s, dict) and s.get(k) for s in sessions)]
        table.add_column("session")
        for k in keys:
            table.add_column(k)
        for s in sessions:
            if isinstance(s, dict):
                table.add_row(short_id(s.get("sessionId") or s.get("id")),
                              *(_plain(s.get(k, "")) for k in keys))
        console.print(table)
    else:
        console.print(f"sessions: {sessions}")


def _print_gate_runs(console: Console, status: Mapping[str, Any]) -> None:
    """The gate runs, one row each: state, exit code, round, the dev session, each gate's item or verdict."""
    from rich.table import Table

    gates = status.get("gates")
    if isinstance(gates, list) and gates:
        table = Table(title=f"gate runs ({len(gates)})", title_justify="left")
        for column in ("gate", "state", "exit", "round", "dev session", "dev state",
                       "gates (item / verdict)"):
            table.add_column(column)
        for g in gates:
            items = g.get("items") or {}
            verdicts = g.get("verdicts") or {}
            shown = ", ".join(f"{a}: {verdicts.get(a) or items.get(a)}" for a in items)
            table.add_row(str(g.get("gateId")), str(g.get("state")), _plain(g.get("exitCode")),
                          str(g.get("round")), short_id(g.get("devSessionId")), str(g.get("devState") or "-"),
                          shown)
        console.print(table)


def _print_pipe(console: Console, status: Mapping[str, Any]) -> None:
    """The ACP pipe's counters, both directions."""
    from rich.table import Table

    pipe = ((status.get("runtime") or {}).get("perf") or {}).get("pipe") or {}
    table = Table(title="ACP pipe (inbound = agent → daemon, outbound = daemon → agent)",
                  title_justify="left")
    for column in ("direction", "count", "totalBytes", "maxBytes", "dropped", "droppedBytes",
                   "maxDroppedBytes"):
        table.add_column(column, justify="right" if column != "direction" else "left")
    for direction in ("inbound", "outbound"):
        d = pipe.get(direction) or {}
        table.add_row(direction, str(d.get("count", 0)), exact_size(d.get("totalBytes", 0)),
                      exact_size(d.get("maxBytes", 0)), str(d.get("dropped", 0)),
                      exact_size(d.get("droppedBytes", 0)), exact_size(d.get("maxDroppedBytes", 0)))
    console.print(table)


def _print_other_counters(console: Console, status: Mapping[str, Any]) -> None:
    """Large frames, sidecars, SSE, delivery and warm children, as one key-value table."""
    other: dict[str, Any] = {}
    for key in ("largeFrames", "sidecars", "sse", "delivery", "warmChildren"):
        value = status.get(key)
        if isinstance(value, dict):
            for k, v in value.items():
                other[f"{key}.{k}"] = v
    if "framesDropped" in status:
        other["framesDropped"] = status["framesDropped"]
    if other:
        console.print(_kv_table("large frames, sidecars, SSE, delivery, warm children", other))


def _print_cluster(console: Console, status: Mapping[str, Any]) -> None:
    """With several daemons: this daemon's cluster counters, each daemon and its leases."""
    from rich.table import Table

    cluster = status.get("cluster")
    if isinstance(cluster, dict):
        title = (f"cluster (this daemon: {cluster.get('daemon')}; lease {cluster.get('leaseSeconds')} s; "
                 f"forwarded writes {cluster.get('forwardedWrites')}, "
                 f"adopted {cluster.get('adoptedSessions')}, "
                 f"leases lost {cluster.get('leasesLost')}, expired leases {cluster.get('expiredLeases')})")
        table = Table(title=title, title_justify="left")
        for column in ("daemon", "advertised at", "state", "heartbeat age", "leases (sessions)"):
            table.add_column(column)
        for d in cluster.get("daemons") or []:
            state = ("live" if d.get("live") else "gone") + (" (this one)" if d.get("self") else "")
            table.add_row(str(d.get("id")), str(d.get("advertiseUrl")), state,
                          f"{d.get('heartbeatAgeSeconds')} s", str(d.get("leases")))
        console.print(table)


def _print_budget(console: Console, status: Mapping[str, Any]) -> None:
    """The ceilings in force (the narrowest request ceiling marked), then coherence findings."""
    from rich.table import Table

    budget = status.get("budget") or {}
    ceilings = budget.get("ceilings") or []
    if ceilings:
        table = Table(title="budget (hopline limits)", title_justify="left")
        for column in ("hop", "ceiling", "value", "source"):
            table.add_column(column)
        narrowest = budget.get("narrowestRequestCeiling")
        for c in ceilings:
            value = exact_size(c["bytes"]) if "bytes" in c else f"{c.get('value')} {c.get('unit', '')}"
            name = str(c.get("name"))
            if name == narrowest:
                name += " (narrowest request ceiling)"
            table.add_row(str(c.get("hop")), name, value, str(c.get("source", "")))
        console.print(table)
    for kind, style in (("errors", "bold red"), ("warnings", "yellow")):
        for finding in budget.get(kind) or []:
            console.print(f"[{style}]{kind[:-1]}[/] {finding.get('rule')}: {finding.get('message')}",
                          highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def status(
        url: str = typer.Option(None, "--url", help=f"The daemon's URL (default: ${URL_ENV})."),
        token: str = typer.Option(None, "--token", help=f"Bearer token (default: ${SERVER_TOKEN_ENV})."),
        as_json: bool = typer.Option(False, "--json", help="Print the status object as JSON."),
    ) -> None:
        """Show a running daemon's sessions, pipe stats, large frames, sidecars, budget and, with
        several daemons, the cluster: the daemons, their leases and sessions."""
        import asyncio

        import httpx
        import orjson
        from rich.console import Console

        from hopline.client import DaemonClient, DaemonError

        budget = budget_or_exit()
        target, bearer = daemon_target(url, token)
        if not target:
            print(f"hopline status: give --url or set {URL_ENV}", file=sys.stderr)
            raise typer.Exit(2)

        async def fetch() -> DaemonStatus:
            async with DaemonClient(target, bearer or "", budget=budget) as client:
                return await client.status()

        try:
            result = asyncio.run(fetch())
        except (DaemonError, httpx.HTTPError) as exc:
            print(f"hopline status: {type(exc).__name__}: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        if as_json:
            typer.echo(orjson.dumps(result).decode())
        else:
            print_status(Console(width=160), result)
