"""`hopline store check [--repair] [--json]`: the store checked by its operator (SPEC T-3).

Reads the journal the daemon would open (``--data-dir`` / ``--store`` as `hopline serve` takes
them), checks it as the daemon's startup does, then reads every event and checks its checksum;
every damaged event is named by session and id, and every gap past a commit point (event ids the
store lost: :mod:`hopline.store.recovery`). ``--repair`` restores what verifies past the commit
points and quarantines what it found (nothing is deleted): see :mod:`hopline.store.check`. Exit 0
when the store is whole (after a repair: when it is usable, its gaps recorded), 1 when damage or a
gap remains, 2 for a bad setting.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from hopline.budget import DATA_DIR_ENV

store_app = typer.Typer(name="store", help="Check (and repair) the daemon's store.", no_args_is_help=True)


def default_data_dir() -> Path:
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "hopline"


@store_app.command("check")
def check(
    data_dir: str = typer.Option("", "--data-dir", help="The daemon's data dir (as `hopline serve`)."),
    store: str = typer.Option("", "--store", metavar="URL", help="sqlite:///PATH or postgresql://… "
                              "(also HOPLINE_STORE_URL)."),
    repair: bool = typer.Option(False, "--repair", help="Quarantine what is damaged (never deletes)."),
    as_json: bool = typer.Option(False, "--json", help="The report as JSON."),
) -> None:
    """Check every stored event; name each damaged one by session and id."""
    import os

    import orjson

    from hopline.budget import Settings
    from hopline.errors import StoreSettingError
    from hopline.store.check import check_sqlite
    from hopline.store.check import repair as repair_sqlite
    from hopline.store.locations import sidecar_location, store_location

    root = Path(data_dir) if data_dir else default_data_dir()
    try:
        settings = Settings.from_env(store_url=store)
        location = store_location(settings.store_url, root)
        bodies = sidecar_location(settings.sidecar_url, root, os.environ)
    except StoreSettingError as exc:
        print(f"hopline store check: bad setting: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    if repair and location.path is not None:
        from hopline.store.dir_lock import holder_if_locked, holder_text

        holder = holder_if_locked(root)
        if holder is not None:  # a repair moves rows and files a live daemon is using
            print(f"hopline store check --repair: a hopline daemon ({holder_text(holder)}) is serving "
                  f"{root}; stop it first", file=sys.stderr)
            raise typer.Exit(2)
    if location.path is None:
        report = _check_postgres(location.dsn, repair)
    else:
        from hopline.sidecars.index import INDEX_FILE
        from hopline.sidecars.store import index_root
        from hopline.store.locations import SIDECARS_DIR
        from hopline.store.sqlite_journal import JOURNAL_SCHEMA

        found = repair_sqlite(location.path, JOURNAL_SCHEMA) if repair else check_sqlite(location.path)
        report = found.to_json()
        _check_index(report, index_root(bodies, root / SIDECARS_DIR) / INDEX_FILE, repair)
    if as_json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_text(report)
    usable = (report["problem"] is None and not report["orphanSegments"]
              and not report.get("sidecarIndexProblem"))
    whole = usable and all(d["reason"] == "quarantined" for d in report["damagedEvents"])
    raise typer.Exit(0 if (whole if repair else report["ok"]) else 1)


def _check_index(report: dict[str, Any], index: Path, repair: bool) -> None:
    """The SQLite sidecar index beside an SQLite journal (:mod:`hopline.store.index_check`), into
    ``report``: its problem (after a repair: what is left of it) and what the repair did."""
    from hopline.sidecars.index import INDEX_SCHEMA
    from hopline.store.index_check import index_problem, repair_index

    if repair:
        report["repaired"] += repair_index(index, INDEX_SCHEMA)
    report["sidecarIndex"] = str(index)
    report["sidecarIndexProblem"] = index_problem(index)
    report["ok"] = report["ok"] and report["sidecarIndexProblem"] is None


def _print_text(report: dict[str, Any]) -> None:
    print(f"store: {report['journal']}")
    print(f"events checked: {report['eventsChecked']}")
    if report["problem"]:
        print(f"PROBLEM: {report['problem']}")
    if report.get("sidecarIndexProblem"):
        print(f"PROBLEM: {report['sidecarIndexProblem']}")
    for name in report["orphanSegments"]:
        print(f"orphan segment file: {name}")
    for damage in report["damagedEvents"]:
        print(f"damaged: session {damage['sessionId']} event {damage['eventId']} "
              f"({damage['eventType'] or 'type unknown'}): {damage['reason']}")
    past = report["pastCommitPoint"]
    if past["sessions"]:
        print(f"past the commit point: {past['restorableEvents']} event(s) and {past['restorablePrompts']} "
              f"prompt change(s) of {past['sessions']} session(s) verify in the segment files; the "
              "daemon's next start restores them (so does --repair)")
    for gap in report["gaps"]:
        ids = (f"events {gap['firstId']} to {gap['lastId']}" if gap["lastId"] is not None
               else f"the events from {gap['firstId']} on (how many is not known)")
        print(f"gap: session {gap['sessionId']} {ids}: lost past the commit point ({gap['reason']}); "
              "a client resuming inside it is told (frame_dropped), and no id of it is given again")
    for line in report["repaired"]:
        print(f"repaired: {line}")
    print("ok: the store is whole" if report["ok"] else
          "not ok: run `hopline store check --repair` to quarantine the damage (nothing is deleted)")


def _check_postgres(dsn: str, repair: bool) -> dict[str, Any]:
    """Every event of a PostgreSQL store read and checked, in pages (repairs are SQLite's only)."""
    import psycopg

    from hopline.budget import redact_url
    from hopline.errors import StoreUnavailable
    from hopline.store.event_groups import inline_events
    from hopline.store.postgres import connect

    damaged: list[dict[str, Any]] = []
    checked = 0
    problem = None
    try:
        with connect(dsn) as conn:
            after: tuple[str, int] = ("", 0)
            while True:
                rows = conn.execute("SELECT session_id, seq, type, data, crc, parts FROM events WHERE "
                                    "(session_id, seq) > (%s, %s) ORDER BY session_id, seq LIMIT 2048",
                                    after).fetchall()
                if not rows:
                    break
                for session_id, *row in rows:
                    for event in inline_events([row]):  # a group row's events each checked
                        checked += 1
                        if event.corrupt is not None:
                            damaged.append({"sessionId": session_id, "eventId": event.seq,
                                            "eventType": event.type, "reason": event.corrupt})
                after = (rows[-1][0], rows[-1][1])
    except (psycopg.Error, StoreUnavailable) as exc:
        problem = f"the PostgreSQL store could not be read ({type(exc).__name__})"
    return {"journal": redact_url(dsn), "ok": problem is None and not damaged, "problem": problem,
            "orphanSegments": [], "eventsChecked": checked, "damagedEvents": damaged, "gaps": [],
            "pastCommitPoint": {"restorableEvents": 0, "restorablePrompts": 0, "sessions": 0},
            "repaired": ["--repair quarantines on SQLite only; nothing was changed"] if repair else []}


def register(app: typer.Typer) -> None:
    app.add_typer(store_app)
