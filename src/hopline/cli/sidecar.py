"""`hopline sidecar SESSION ID > file`: the whole of a field that went to a sidecar (SPEC S-2, C-2).

From a running daemon (``--url``, default ``$HOPLINE_URL``, with ``--token`` or
``$HOPLINE_SERVER_TOKEN``), or straight from a daemon's data directory on this machine
(``--data-dir``, e.g. the one ``hopline run`` kept after its embedded stack stopped). The bytes go
to stdout as they are read; their size and sha256 are checked against what the store recorded, and
a mismatch exits 1 (after the bytes: redirect to a file and discard it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from hopline.budget import SERVER_TOKEN_ENV, URL_ENV
from hopline.cli._common import budget_or_exit, daemon_target


def fetch_hint(session_id: str, sidecar_id: str, *, data_dir: str | None = None, url: str | None = None,
               token_from_env: bool = True) -> str:
    """The command line that fetches one sidecar (what `hopline run` prints): from the data
    directory, or from the daemon at ``url``. The token is never in it: the command reads
    ``$HOPLINE_SERVER_TOKEN`` (said as ``--token "$HOPLINE_SERVER_TOKEN"`` when the run was given
    ``--token`` rather than the variable); a user and password in the URL are left out too."""
    import shlex

    where = ""
    if data_dir:
        where = f" --data-dir {shlex.quote(data_dir)}"
    elif url:
        import httpx

        shown = str(httpx.URL(url).copy_with(username=None, password=None))
        where = f" --url {shlex.quote(shown)}"
        if not token_from_env:
            where += f' --token "${SERVER_TOKEN_ENV}"'
    if sidecar_id.startswith("-"):  # an id from before ids were kept from starting with "-"
        return f"hopline sidecar{where} -- {session_id} {sidecar_id} > file"
    return f"hopline sidecar {session_id} {sidecar_id}{where} > file"


def _from_data_dir(data_dir: Path, session_id: str, sidecar_id: str) -> int:
    """The store a daemon with this data directory and this environment's settings opens
    (``HOPLINE_STORE_URL``, ``HOPLINE_SIDECAR_URL``: a shared store is read where it is)."""
    import hashlib

    from hopline.budget import Settings
    from hopline.errors import ObjectStoreUnavailable, StoreDamaged
    from hopline.sidecars.entry import is_valid_sidecar_id
    from hopline.sidecars.index import INDEX_FILE
    from hopline.sidecars.store import index_root, open_sidecar_store
    from hopline.store.locations import SIDECARS_DIR, sidecar_location, store_location

    settings = Settings.from_env()
    location = store_location(settings.store_url, data_dir)
    bodies = sidecar_location(settings.sidecar_url, data_dir, os.environ)
    if not location.shared and not (index_root(bodies, data_dir / SIDECARS_DIR) / INDEX_FILE).is_file():
        print("hopline sidecar: no sidecar store in that data directory", file=sys.stderr)
        return 2
    try:
        store = open_sidecar_store(location, bodies, budget_or_exit(), index_dir=data_dir / SIDECARS_DIR)
    except StoreDamaged as exc:
        print(f"hopline sidecar: {exc}", file=sys.stderr)
        return 1
    try:
        entry = store.get(session_id, sidecar_id) if is_valid_sidecar_id(sidecar_id) else None
        handle = store.open_blob(entry) if entry is not None else None
        if entry is None or handle is None:
            print("hopline sidecar: no such sidecar for that session (or it expired)", file=sys.stderr)
            return 1
        digest = hashlib.sha256()
        size = 0
        for chunk in store.iter_range(handle, 0, entry.size):
            digest.update(chunk)
            size += len(chunk)
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    except ObjectStoreUnavailable as exc:  # failed, or past HOPLINE_OBJECT_STORE_TIMEOUT
        print(f"hopline sidecar: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if size != entry.size or digest.hexdigest() != entry.sha256:
        print(f"hopline sidecar: the body ({size} bytes) does not match its record ({entry.size} bytes, "
              f"sha256 {entry.sha256})", file=sys.stderr)
        return 1
    return 0


async def _from_daemon(url: str, token: str | None, session_id: str, sidecar_id: str) -> int:
    from hopline.client import DaemonClient

    out = sys.stdout.buffer
    async with DaemonClient(url, token, budget=budget_or_exit()) as client:
        await client.download_sidecar(session_id, sidecar_id, out.write)
    out.flush()
    return 0


def register(app: typer.Typer) -> None:
    @app.command()
    def sidecar(
        session_id: str = typer.Argument(..., help="The session that owns the sidecar."),
        sidecar_id: str = typer.Argument(..., help="The sidecar id (from _meta[\"hopline.sidecar\"])."),
        url: str = typer.Option(None, "--url", help=f"A running daemon (default: ${URL_ENV})."),
        token: str = typer.Option(None, "--token", help=f"Bearer token (default: ${SERVER_TOKEN_ENV})."),
        data_dir: str = typer.Option(None, "--data-dir",
                                     help="Read the store of this daemon data directory instead."),
    ) -> None:
        """Write the whole of a sidecar to stdout, its size and sha256 checked."""
        import asyncio

        from hopline.client import DaemonError
        from hopline.errors import SidecarIntegrityError

        if data_dir is not None:
            raise typer.Exit(_from_data_dir(Path(data_dir), session_id, sidecar_id))
        base, bearer = daemon_target(url, token)
        if not base:
            print(f"hopline sidecar: give --url (or set {URL_ENV}) or --data-dir", file=sys.stderr)
            raise typer.Exit(2)
        try:
            code = asyncio.run(_from_daemon(base, bearer or "", session_id, sidecar_id))
        except (DaemonError, SidecarIntegrityError) as exc:
            print(f"hopline sidecar: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        raise typer.Exit(code)
