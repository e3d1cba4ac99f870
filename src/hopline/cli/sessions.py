"""`hopline sessions`: a daemon's sessions, what each is doing; `show` one, `delete` some (SPEC C-4).

Talks to ``--url`` (default ``$HOPLINE_URL``) with ``--token`` (default ``$HOPLINE_SERVER_TOKEN``):
``GET /session``, ``GET /session/{id}``, ``DELETE /session/{id}``. A session whose agent the daemon
stopped (idle past ``HOPLINE_SESSION_IDLE_SECONDS``, or after a restart) is listed ``detached``: its
events stay readable, and ``POST /session/{id}/load`` gives it a new agent.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from hopline.budget import SERVER_TOKEN_ENV, URL_ENV
from hopline.cli._common import budget_or_exit, daemon_target, run_client

if TYPE_CHECKING:
    from hopline.client import DaemonClient

T = TypeVar("T")

URL_OPTION = typer.Option(None, "--url", help=f"The daemon's URL (default: ${URL_ENV}).")
TOKEN_OPTION = typer.Option(None, "--token", help=f"Bearer token (default: ${SERVER_TOKEN_ENV}).")
JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")
LIMIT_OPTION = typer.Option(None, "--limit", min=1, help="List at most this many.")


def _with_client(command: str, url: str | None, token: str | None,
                 work: Callable[[DaemonClient], Awaitable[T]]) -> T:
    """Run ``work`` with a client of the daemon the options (or the environment) name."""
    from hopline.client import DaemonClient

    target, bearer = daemon_target(url, token)
    if not target:
        print(f"hopline {command}: give --url or set {URL_ENV}", file=sys.stderr)
        raise typer.Exit(2)
    budget = budget_or_exit()

    async def main() -> T:
        async with DaemonClient(target, bearer or "", budget=budget) as client:
            return await work(client)

    return run_client(command, main())


def _when(created: Any) -> str:
    import datetime

    if not isinstance(created, int | float):
        return "-"
    return datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M:%S")


def print_sessions(rows: Sequence[Mapping[str, Any]], total: int) -> None:
    """A table on a terminal; elsewhere one line per session, whole (a script's ``cut`` or ``awk``)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    columns = ("session", "state", "activity", "created", "profile", "cwd")
    cells = [(str(row.get("sessionId")), str(row.get("state")),
              str(row.get("activity")).replace("_", " ") if row.get("state") == "ready" else "-",
              _when(row.get("created")), str(row.get("profile") or "-"), str(row.get("cwd") or "-"))
             for row in rows]
    if not console.is_terminal:
        for line in [columns, *cells]:
            print("\t".join(line))
        return
    if not rows:
        console.print("no sessions")
        return
    table = Table(title=f"{len(rows)} of {total} sessions, the newest first", title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=column == "session", overflow="fold")
    for line in cells:
        table.add_row(*line)
    console.print(table)


def _json(value: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(value).decode() + "\n")


def _list(url: str | None, token: str | None, as_json: bool, limit: int | None) -> None:
    rows, total = _with_client("sessions", url, token, lambda client: client.sessions(limit))
    if as_json:
        _json({"sessions": rows, "total": total})
    else:
        print_sessions(rows, total)


def register(app: typer.Typer) -> None:
    sessions_app = typer.Typer(help="A daemon's sessions: list them (the default), show one, delete some.",
                               invoke_without_command=True, no_args_is_help=False)
    app.add_typer(sessions_app, name="sessions")

    @sessions_app.callback()
    def sessions(ctx: typer.Context, url: str = URL_OPTION, token: str = TOKEN_OPTION,
                 as_json: bool = JSON_OPTION, limit: int = LIMIT_OPTION) -> None:
        """List the daemon's sessions, the newest first, and what each is doing."""
        ctx.obj = {"url": url, "token": token}
        if ctx.invoked_subcommand is None:
            _list(url, token, as_json, limit)

    @sessions_app.command("list")
    def list_command(ctx: typer.Context, url: str = URL_OPTION, token: str = TOKEN_OPTION,
                     as_json: bool = JSON_OPTION, limit: int = LIMIT_OPTION) -> None:
        """List the daemon's sessions, the newest first, and what each is doing."""
        given = ctx.obj or {}
        _list(url or given.get("url"), token or given.get("token"), as_json, limit)

    @sessions_app.command("show")
    def show(ctx: typer.Context, session_id: str = typer.Argument(..., help="The session id."),
             url: str = URL_OPTION, token: str = TOKEN_OPTION, as_json: bool = JSON_OPTION) -> None:
        """One session: its state, what it is doing, its workspace and profile, its last event id."""
        given = ctx.obj or {}
        row = _with_client("sessions show", url or given.get("url"), token or given.get("token"),
                           lambda client: client.session(session_id))
        if as_json:
            _json(row)
            return
        for key in ("sessionId", "state", "activity", "pendingPrompts", "pendingPermissions", "subscribers",
                    "lastEventId", "profile", "permissionMode", "cwd"):
            print(f"{key}: {row.get(key)}")
        print(f"created: {_when(row.get('created'))}")

    @sessions_app.command("delete")
    def delete(ctx: typer.Context,
               session_ids: list[str] = typer.Argument(..., help="The sessions to delete."),
               url: str = URL_OPTION, token: str = TOKEN_OPTION) -> None:
        """Delete sessions: their agents stop, their events and sidecars go (exit 1 if one could not be)."""
        from hopline.client import DaemonError

        given = ctx.obj or {}

        async def delete_each(client: DaemonClient) -> int:
            failed = 0
            for session_id in session_ids:
                try:
                    await client.delete_session(session_id)
                except DaemonError as exc:
                    failed += 1
                    print(f"hopline sessions delete: {session_id}: {exc}", file=sys.stderr)
                else:
                    print(f"deleted {session_id}")
            return failed

        failed = _with_client("sessions delete", url or given.get("url"), token or given.get("token"),
                              delete_each)
        raise typer.Exit(1 if failed else 0)
