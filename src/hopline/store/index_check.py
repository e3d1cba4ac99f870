"""The SQLite sidecar index checked (SPEC T-3): at daemon startup, and by `hopline store
check`, as :mod:`hopline.store.check` does for the journal.

The index must pass ``PRAGMA quick_check``, and must not be missing (or emptied) while sidecar
bodies remain in ``blobs/`` beside it: a body no row names is collected as an orphan, so starting
on such an index would delete what the journal's stubs point at. :func:`repair_index` quarantines,
never deletes: the damaged index is moved into ``sidecars.quarantine/<time>/`` and what of it reads
is copied into a new one; bodies that no row names are moved there too. A PostgreSQL index is
checked with the PostgreSQL store; bodies in S3 are checked by their sha256 on every read.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path

from hopline.errors import StoreDamaged
from hopline.store.blobs import BLOBS_PREFIX
from hopline.store.check import move_sqlite_file, sqlite_problem
from hopline.store.private import private_dir, private_file

QUARANTINE_DIR = "sidecars.quarantine"


def index_problem(index: Path) -> str | None:
    """The index's fault as one sentence, or None when it is whole (or new: absent, no bodies)."""
    if index.exists() and index.stat().st_size > 0:
        problem = sqlite_problem(index)
        return None if problem is None else f"the sidecar index {problem}"
    bodies = index.parent / BLOBS_PREFIX
    if bodies.is_dir() and next(bodies.iterdir(), None) is not None:
        state = "missing" if not index.exists() else "empty (0 bytes)"
        return f"the sidecar index is {state} while sidecar bodies remain beside it in {BLOBS_PREFIX}/"
    return None


def require_usable_index(index: Path) -> None:
    """At startup: :class:`StoreDamaged`, with the one line to print, when the index cannot be used."""
    problem = index_problem(index)
    if problem is not None:
        raise StoreDamaged(f"the sidecar index {index} cannot be used: {problem}. Next: run `hopline store "
                           "check --repair` with this daemon's --data-dir to quarantine it (nothing is "
                           "deleted; what of it reads is kept)")


def repair_index(index: Path, schema: str) -> list[str]:
    """Quarantine a damaged index (a new one holds what of it reads, made with ``schema``) and the
    bodies no row of the index names; what was done, one line each."""
    if index_problem(index) is None:
        return []
    quarantine = index.parent / QUARANTINE_DIR / time.strftime("%Y%m%dT%H%M%S")
    private_dir(quarantine)
    done: list[str] = []
    if index.exists() and index.stat().st_size > 0:
        moved, done = move_sqlite_file(index, quarantine)
        done.append(f"copied {_salvage_rows(moved, index, schema)} readable row(s) into a new {index.name}")
    else:
        index.unlink(missing_ok=True)  # empty: nothing to keep
    done += _quarantine_unnamed_bodies(index, quarantine)
    return done


def _salvage_rows(old: Path, new: Path, schema: str) -> int:
    """Every row of ``old`` that reads, table by table, into a new index at ``new``."""
    private_file(new)
    target = sqlite3.connect(new, isolation_level=None)
    copied = 0
    try:
        target.executescript(schema)
        tables = [row[0] for row in target.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        source = sqlite3.connect(f"file:{old}?mode=ro", uri=True)
        try:
            target.execute("BEGIN IMMEDIATE")
            for table in tables:  # our schema's names, not input
                with contextlib.suppress(sqlite3.DatabaseError):  # a damaged page ends that table
                    for row in source.execute(f"SELECT * FROM {table}"):
                        marks = ", ".join("?" * len(row))
                        target.execute(f"INSERT OR IGNORE INTO {table} VALUES ({marks})", row)
                        copied += 1
            target.execute("COMMIT")
        finally:
            source.close()
    finally:
        target.close()
    return copied


def _quarantine_unnamed_bodies(index: Path, quarantine: Path) -> list[str]:
    bodies = index.parent / BLOBS_PREFIX
    if not bodies.is_dir():
        return []
    named: set[str] = set()
    if index.exists():
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
        try:
            named = {row[0] for row in db.execute("SELECT id FROM sidecars")}
        finally:
            db.close()
    unnamed = [path for path in bodies.iterdir() if path.name not in named]
    if not unnamed:
        return []
    private_dir(quarantine / BLOBS_PREFIX)
    for path in unnamed:
        os.replace(path, quarantine / BLOBS_PREFIX / path.name)
    return [f"moved {len(unnamed)} sidecar bodies no index row names to {quarantine / BLOBS_PREFIX}"]
