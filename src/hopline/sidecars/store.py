"""The sidecar store (SPEC S-2, X): large tool output kept off the wire, per session.

The index (sidecars, per-session write tokens, counters) is in SQLite, or in the PostgreSQL store
when several daemons share one (``dsn``); the bodies are a :class:`~hopline.store.blobs.BlobStore`:
files (the default) or an S3-compatible bucket. The default layout under ``root``::

    blobs/<id>           one file per sidecar, named by its validated id (never by user input)
    tmp/                 files being written; renamed into blobs/ inside the index transaction
    sidecars.sqlite3     the index (WAL)

A sidecar id is ``secrets.token_urlsafe(24)`` (32 characters of the URL-safe alphabet) and is
checked against :data:`SIDECAR_ID_RE` before any database or blob access. Quotas come
from the :class:`~hopline.budget.Budget`: one object, one session and the whole store, each
exact at the limit (the limit stores, one byte over is refused).

The daemon and our own agent (S-3, :mod:`.writer`) may open the same SQLite root from two processes;
several daemons open the same PostgreSQL index. Every write takes the index's write lock (SQLite's
``BEGIN IMMEDIATE``; PostgreSQL: one advisory transaction lock) around the quota check, the insert
and the body's publication, so quotas hold across processes and a committed row always has its body.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hopline.budget import Budget
from hopline.errors import ObjectStoreUnavailable
from hopline.sidecars.entry import (
    FALLBACK_KEYS,
    REASON_DISK_ERROR,
    REASON_OBJECT_STORE_UNAVAILABLE,
    REASON_OVER_OBJECT,
    REASON_OVER_SESSION,
    REASON_OVER_STORE,
    SidecarEntry,
    SidecarRefused,
    is_valid_sidecar_id,
    new_sidecar_id,
    safe_media_type,
)
from hopline.sidecars.expiry import ADOPT, LIVE_ELSEWHERE, TOUCH, RunningClock
from hopline.sidecars.index import INDEX_FILE, IndexTransaction, SidecarIndex
from hopline.store.blobs import BlobStore, FileBlobs, S3Blobs
from hopline.store.index_check import require_usable_index
from hopline.store.locations import S3, SidecarLocation, StoreLocation

log = logging.getLogger("hopline.sidecars")

WRITE_TOKEN_BYTES = 32
_KEPT_OFF_WIRE = "bytesKeptOffWire"


def _storage_reason(exc: OSError) -> str:
    """The refusal reason of a body write that failed: the object store's, or the local disk's."""
    return REASON_OBJECT_STORE_UNAVAILABLE if isinstance(exc, ObjectStoreUnavailable) else REASON_DISK_ERROR


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class SidecarStore:
    """Sidecar bodies plus their index, safe for the threads of one daemon process.

    All index access goes through :meth:`_execute` / :meth:`_transaction` (the SQL is written once,
    with ``?`` placeholders, for SQLite and PostgreSQL alike) and every body key through
    :meth:`_blob_path`, which refuses anything but a valid id (defence in depth: callers validate
    first).
    """

    def __init__(self, root: Path, budget: Budget, *, clock: Callable[[], float] | None = None,
                 blobs: BlobStore | None = None, dsn: str | None = None,
                 index: SidecarIndex | None = None, durable: bool = True) -> None:
        """``blobs`` and ``index``: where the bodies and the rows go (default: files under ``root``;
        a SQLite index there, or PostgreSQL's at ``dsn``); ``durable``: a SQLite index synced at
        every commit (``HOPLINE_STORE_SYNC=full``, the default)."""
        self.root = Path(root)
        self.budget = budget
        self.blobs: BlobStore = blobs if blobs is not None else FileBlobs(self.root, shared=dsn is not None)
        # Several daemons write here: a body without a row may be in flight (orphans wait a grace).
        self.shared = dsn is not None or self.blobs.shared
        self.blobs_dir = self.root / "blobs"
        self.tmp_dir = self.root / "tmp"
        self.db_path = self.root / INDEX_FILE
        self._index = index if index is not None else SidecarIndex(
            self.root, dsn=dsn, statement_timeout_seconds=budget.store_statement_timeout_seconds,
            durable=durable, deadline_seconds=budget.store_request_deadline_seconds)
        self._lock = self._index.lock
        self._db_errors = self._index.errors
        # One clock for the index's times (created, a session's last activity, expiry): a shared
        # index's is the store's now(), whatever ``clock`` says (a daemon 24 h ahead would reap every
        # daemon's sidecars); alone, the seconds daemons ran on it (sidecars/expiry.py), or ``clock``
        # (tests fake it). Never a wall clock: a step of it must not expire anything.
        self._running = RunningClock(self._index) if dsn is None else None
        self.clock: Callable[[], float] = (self._index.db.now if self._running is None
                                           else clock if clock is not None else self._running)
        # bodies' ages (the orphans' grace) are against real time, the store's when shared
        self._real_clock: Callable[[], float] = self._index.db.now if dsn is not None else time.time
        # Counters the index could not record (a failing disk): still reported by stats().
        self._unrecorded: dict[str, int] = {}

    @property
    def local(self) -> bool:
        """Files and a SQLite index on this machine: our own agent may write here itself (S-3)."""
        return not self.shared and isinstance(self.blobs, FileBlobs)

    # --- low-level access (every index query and every body key goes through here) ------------

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self._index.execute(sql, params)

    def _transaction(self) -> IndexTransaction:
        return self._index.transaction()

    def _blob_path(self, sidecar_id: str) -> Path:
        """Where a valid id's body is as a file (ValueError for anything else); its name is the key
        of every body operation, whatever the backend."""
        if not is_valid_sidecar_id(sidecar_id):
            raise ValueError("not a sidecar id")
        return self.blobs_dir / sidecar_id

    def _blob_key(self, sidecar_id: str) -> str:
        return self._blob_path(sidecar_id).name

    def close(self) -> None:
        self._index.close()

    def __enter__(self) -> SidecarStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- writing --------------------------------------------------------------------------------

    def put(self, session_id: str, data: bytes, media_type: str) -> SidecarEntry:
        """Store ``data`` for ``session_id``; raises :class:`SidecarRefused` over quota or on disk error.

        The same bytes with the same media type already stored for the session (a replayed update,
        or one output carried both as content text and as rawOutput) return the existing entry and
        cost no quota.
        """
        try:
            return self._put(session_id, data, safe_media_type(media_type))
        except SidecarRefused as refused:
            # Counted outside the refused transaction (which rolls back).
            self._bump(FALLBACK_KEYS.get(refused.reason, FALLBACK_KEYS[REASON_DISK_ERROR]), 1)
            log.warning("sidecar refused", extra={"reason": refused.reason, "limit": refused.limit,
                                                  "observed": refused.observed})
            raise

    def _put(self, session_id: str, data: bytes, media: str) -> SidecarEntry:
        size = len(data)
        limit = self.budget.sidecar_max_object_bytes
        if size > limit:
            raise SidecarRefused(REASON_OVER_OBJECT, limit, size)
        digest = hashlib.sha256(data).hexdigest()
        existing = self._find_same(session_id, digest, media)
        if existing is not None:
            return existing
        # Cheap check before writing a body; repeated under the write lock below.
        self._check_quotas(session_id, size)
        now = self.clock()
        entry = SidecarEntry(new_sidecar_id(), session_id, size, digest, media, now,
                             now + self.budget.sidecar_ttl_seconds)
        key = self._blob_key(entry.id)
        try:
            staged = self.blobs.stage(key, data)
        except OSError as exc:
            raise SidecarRefused(_storage_reason(exc), None, size) from exc
        published = False
        try:
            result = self._commit(entry, key, staged)
            published = result is entry
            return result
        finally:
            if not published:  # refused, failed, or the same bytes were there already
                self.blobs.discard(staged)

    def _commit(self, entry: SidecarEntry, key: str, staged: Any) -> SidecarEntry:
        try:
            with self._transaction():
                existing = self._find_same(entry.session_id, entry.sha256, entry.media_type)
                if existing is not None:
                    return existing
                self._check_quotas(entry.session_id, entry.size)
                self._execute(
                    "INSERT INTO sidecars (id, session_id, size, sha256, media_type, created_at, expires_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (entry.id, entry.session_id, entry.size, entry.sha256, entry.media_type,
                     entry.created_at, entry.expires_at))
                self._execute(TOUCH, (entry.session_id, entry.created_at))  # the session's activity
                # Published before COMMIT: a visible row always has its body.
                self.blobs.publish(staged, key)
        except SidecarRefused:
            raise
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.blobs.delete(key)
            raise SidecarRefused(_storage_reason(exc), None, entry.size) from exc
        except self._db_errors as exc:
            with contextlib.suppress(OSError):
                self.blobs.delete(key)
            raise SidecarRefused(REASON_DISK_ERROR, None, entry.size) from exc
        self.blobs.settle()
        return entry

    def _find_same(self, session_id: str, digest: str, media: str) -> SidecarEntry | None:
        try:
            row = self._execute(
                "SELECT id, session_id, size, sha256, media_type, created_at, expires_at FROM sidecars"
                " WHERE session_id = ? AND sha256 = ? AND media_type = ? LIMIT 1",
                (session_id, digest, media)).fetchone()
        except self._db_errors:
            return None
        return SidecarEntry(*row) if row else None

    def _check_quotas(self, session_id: str, size: int) -> None:
        try:
            session_bytes = int(self._execute(
                "SELECT COALESCE(SUM(size), 0) FROM sidecars WHERE session_id = ?", (session_id,)
            ).fetchone()[0])
            store_bytes = int(self._execute("SELECT COALESCE(SUM(size), 0) FROM sidecars").fetchone()[0])
        except self._db_errors as exc:
            raise SidecarRefused(REASON_DISK_ERROR, None, size) from exc
        if session_bytes + size > self.budget.sidecar_max_session_bytes:
            raise SidecarRefused(REASON_OVER_SESSION, self.budget.sidecar_max_session_bytes,
                                 session_bytes + size)
        if store_bytes + size > self.budget.sidecar_max_store_bytes:
            raise SidecarRefused(REASON_OVER_STORE, self.budget.sidecar_max_store_bytes, store_bytes + size)

    # --- counters -------------------------------------------------------------------------------

    def _bump(self, name: str, amount: int) -> None:
        try:
            self._execute(
                "INSERT INTO counters (name, value) VALUES (?, ?)"
                " ON CONFLICT(name) DO UPDATE SET value = counters.value + excluded.value", (name, amount))
        except self._db_errors:
            with self._lock:
                self._unrecorded[name] = self._unrecorded.get(name, 0) + amount

    def count_kept_off_wire(self, nbytes: int) -> None:
        """Record bytes that did not travel on the wire because a sidecar carried them."""
        if nbytes > 0:
            self._bump(_KEPT_OFF_WIRE, nbytes)

    def count_fallback(self, reason: str) -> None:
        """Record a fallback the store did not see itself (an unexpected projection error)."""
        self._bump(FALLBACK_KEYS.get(reason, FALLBACK_KEYS[REASON_DISK_ERROR]), 1)

    def stats(self) -> dict[str, Any]:
        """For ``/daemon/status``: live count and bytes, and cumulative counters (kept across restarts)."""
        counters: dict[str, int] = {}
        count = total = 0
        try:
            row = self._execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM sidecars").fetchone()
            count, total = int(row[0]), int(row[1])
            rows = self._execute("SELECT name, value FROM counters").fetchall()
            counters = {str(k): int(v) for k, v in rows}
        except self._db_errors:
            pass
        with self._lock:
            for name, value in self._unrecorded.items():
                counters[name] = counters.get(name, 0) + value
        return {
            "count": count,
            "bytes": total,
            "bytesKeptOffWire": counters.get(_KEPT_OFF_WIRE, 0),
            "fallbacks": {key: counters.get(key, 0) for key in FALLBACK_KEYS.values()},
        }

    # --- reading --------------------------------------------------------------------------------

    def get(self, session_id: str, sidecar_id: str) -> SidecarEntry | None:
        """The entry if ``sidecar_id`` is valid, belongs to ``session_id`` and is stored (until the
        reaper removes it: it alone knows which sessions live, see :mod:`.expiry`)."""
        if not is_valid_sidecar_id(sidecar_id) or not isinstance(session_id, str):
            return None
        row = self._execute(
            "SELECT id, session_id, size, sha256, media_type, created_at, expires_at FROM sidecars"
            " WHERE id = ? AND session_id = ?", (sidecar_id, session_id)).fetchone()
        return SidecarEntry(*row) if row else None

    def open_blob(self, entry: SidecarEntry) -> Any | None:
        """A handle on the entry's body for :meth:`iter_range`, or ``None`` if it is gone (reaped
        meanwhile)."""
        return self.blobs.open(self._blob_key(entry.id))

    def iter_range(self, handle: Any, start: int, stop: int) -> Iterator[bytes]:
        """Bytes ``[start, stop)`` of an open body, in chunks; releases ``handle`` when done."""
        return self.blobs.iter_range(handle, start, stop)

    def read_bytes(self, entry: SidecarEntry) -> bytes | None:
        handle = self.open_blob(entry)
        if handle is None:
            return None
        return b"".join(self.iter_range(handle, 0, entry.size))

    # --- lifecycle ------------------------------------------------------------------------------

    def delete_session(self, session_id: str) -> int:
        """Remove every sidecar and write token of a session; returns the number of sidecars."""
        with self._transaction():
            ids = [r[0] for r in self._execute(
                "SELECT id FROM sidecars WHERE session_id = ?", (session_id,)).fetchall()]
            self._execute("DELETE FROM sidecars WHERE session_id = ?", (session_id,))
            self._execute("DELETE FROM write_tokens WHERE session_id = ?", (session_id,))
            self._execute("DELETE FROM sidecar_sessions WHERE session_id = ?", (session_id,))
        self._unlink_blobs(ids)
        return len(ids)

    def reap_expired(self, now: float | None = None, *, live: Iterable[str] = ()) -> int:
        """The ``live`` sessions marked active at ``now`` (the index's clock), then every sidecar of
        a session inactive for its time to live removed (:mod:`.expiry`); returns how many."""
        moment = self.clock() if now is None else now
        expired = "SELECT session_id FROM sidecar_sessions WHERE active_at <= ?" + (
            LIVE_ELSEWHERE if self._index.dsn is not None else "")
        since = (moment - self.budget.sidecar_ttl_seconds,)
        with self._transaction():
            for session_id in live:
                self._execute(TOUCH, (session_id, moment))
            self._execute(ADOPT, (moment,))
            ids = [r[0] for r in self._execute(
                f"SELECT id FROM sidecars WHERE session_id IN ({expired})", since).fetchall()]
            self._execute(f"DELETE FROM sidecars WHERE session_id IN ({expired})", since)
            self._execute(f"DELETE FROM sidecar_sessions WHERE session_id IN ({expired})", since)
        if self._running is not None:
            self._running.persist()
        self._unlink_blobs(ids)
        if ids:
            log.info("sidecars reaped", extra={"count": len(ids)})
        return len(ids)

    def _unlink_blobs(self, ids: list[str]) -> None:
        # After COMMIT: a body left behind by a failed delete is an orphan, collected at startup.
        for sidecar_id in ids:
            with contextlib.suppress(OSError, ValueError):
                self.blobs.delete(self._blob_key(sidecar_id))

    def collect_orphans(self, now: float | None = None) -> int:
        """At daemon startup: remove bodies without a row, rows without a (complete) body, staged
        bodies.

        Returns the number of bodies and rows removed. Runs under the write lock, so no put can
        commit meanwhile. Alone on its store (SQLite), staged bodies are removed unconditionally, so
        call it before any agent child (S-3 writer) is started; on a shared store (several daemons)
        a body or a staged file younger than ``HOPLINE_SIDECAR_ORPHAN_GRACE_SECONDS`` may be another
        daemon's write in flight and is left alone. ``now``: the moment ages are measured at
        (default: the store's clock, the same one the bodies' times come from).
        """
        grace = self.budget.sidecar_orphan_grace_seconds if self.shared else 0.0
        now = self._real_clock() if now is None else now
        removed = 0
        with self._transaction():
            rows = {r[0]: int(r[1]) for r in self._execute("SELECT id, size FROM sidecars").fetchall()}
            intact: set[str] = set()
            for item in self.blobs.listing(now):
                expected = rows.get(item.name) if is_valid_sidecar_id(item.name) else None
                if expected is not None and item.size == expected:
                    intact.add(item.name)
                    continue
                if expected is None and item.age_seconds < grace:
                    continue  # perhaps another daemon's body whose row is about to commit
                if self.blobs.remove_listed(item.name):
                    removed += 1
            for sidecar_id in rows.keys() - intact:
                self._execute("DELETE FROM sidecars WHERE id = ?", (sidecar_id,))
                removed += 1
        removed += self.blobs.clear_staging(grace, now)
        if removed:
            log.info("sidecar orphans collected", extra={"count": removed})
        return removed

    # --- per-session write tokens (S-3) --------------------------------------------------------

    def mint_write_token(self, session_id: str) -> str:
        """A new token that lets a process on this machine write sidecars for ``session_id`` only.

        Only its SHA-256 is stored. Deleted with the session (:meth:`delete_session`).
        """
        token = secrets.token_urlsafe(WRITE_TOKEN_BYTES)
        self._execute("INSERT INTO write_tokens (token_sha256, session_id, created_at) VALUES (?, ?, ?)",
                      (_token_digest(token), session_id, self.clock()))
        return token

    def session_for_write_token(self, token: str) -> str | None:
        if not isinstance(token, str) or not token or len(token) > 256:
            return None
        row = self._execute("SELECT session_id FROM write_tokens WHERE token_sha256 = ?",
                            (_token_digest(token),)).fetchone()
        return row[0] if row else None

    def revoke_write_tokens(self, session_id: str) -> int:
        return int(self._execute("DELETE FROM write_tokens WHERE session_id = ?", (session_id,)).rowcount)


def index_root(sidecars: SidecarLocation, index_dir: Path) -> Path:
    """Where the SQLite index lives: beside the files, or in ``index_dir`` for S3 bodies."""
    if sidecars.kind == S3:
        return sidecars.path or index_dir
    assert sidecars.path is not None
    return sidecars.path


def open_sidecar_store(store: StoreLocation, sidecars: SidecarLocation, budget: Budget, *,
                       index_dir: Path, clock: Callable[[], float] | None = None,
                       durable: bool = True) -> SidecarStore:
    """The sidecar store the settings name (SPEC X): the index in the PostgreSQL store when there is
    one (else SQLite: beside the files, or in ``index_dir`` for S3 bodies), the bodies in files or in
    the bucket."""
    blobs: BlobStore
    root = index_root(sidecars, index_dir)
    if sidecars.kind == S3:
        assert sidecars.s3 is not None
        blobs = S3Blobs(sidecars.s3, timeout_seconds=budget.object_store_timeout_seconds)
    else:
        blobs = FileBlobs(root, shared=store.shared)
    if not store.shared:
        require_usable_index(root / INDEX_FILE)  # quick_check; not emptied under its bodies (T-3)
    return SidecarStore(root, budget, clock=clock, blobs=blobs, dsn=store.dsn if store.shared else None,
                        durable=durable)
