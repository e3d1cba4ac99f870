"""The SQLite journal's writer thread (SPEC D-5, T-1): one connection, group commit, checkpoints.

The writer thread alone owns the write connection and the segment files' writer: every write
(event commits, sessions, prompts) is queued to it in call order; it takes everything queued at
once, runs it in ONE transaction, then settles the batch's futures on the event loop. A batch
whose transaction fails is rolled back (what it appended to the segment files cut back) and run
again one write at a time, so only the failing write fails.

**Durable when acknowledged** (``durable``, the default ``HOPLINE_STORE_SYNC=full``): SQLite runs
with ``synchronous=FULL`` (the WAL is synced at every commit) and the segment files a transaction
appended to are ``fdatasync``-ed before it commits: a future that resolved survives a power loss.
With ``normal``, SQLite syncs the WAL at checkpoints only and the segment files before each
checkpoint: a daemon crash loses nothing acknowledged, a power loss may lose the last commits.

Checkpoints run in the writer between batches (``wal_autocheckpoint`` is off): when the queue is
empty and the WAL holds more than ``CHECKPOINT_BYTES``, or whatever the queue holds once it passes
four times that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hopline.store.segments import SegmentWriter

# Storage layout, not a limit: the WAL grows to about this before the writer checkpoints it (what
# SQLite's default autocheckpoint of 1000 pages gave with the former 32 KiB pages).
CHECKPOINT_BYTES = 32 * 1024 * 1024

T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class _Write:
    """One queued write: ``apply`` runs in the writer's transaction; its result or error settles
    ``future`` on ``loop`` (after ``settled``, the journal's own bookkeeping, when given)."""

    apply: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    settled: Callable[[BaseException | None], None] | None = None


class _Stop:
    """The writer's last item (queued by :meth:`SqliteWriter.stop`)."""


class SqliteWriter:
    """The writer thread over ``db`` (WAL mode set by the caller) and the segment files. What a
    write appends to the WAL is counted by it in :attr:`wal_bytes` (for the checkpoint); a session
    whose segment file goes once its deletion commits is named by :meth:`unlink_after_commit`."""

    def __init__(self, db: sqlite3.Connection, segments: SegmentWriter, *, durable: bool) -> None:
        self.durable = durable
        db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        db.execute("PRAGMA wal_autocheckpoint=0")  # the writer checkpoints between batches
        self._db = db  # the writer thread's alone from here on
        self._segments = segments  # the writer thread's too
        self._unlink_after_commit: list[str] = []
        self._queue: queue.SimpleQueue[_Write | _Stop] = queue.SimpleQueue()
        self.wal_bytes = 0  # written since the last checkpoint (writer thread)
        self.transactions = 0  # committed by the writer (group commit: fewer than the commits)
        self.checkpoints = 0
        self._closed = False
        self._writer_thread = threading.Thread(target=self._write_loop, name="hopline-journal-writer",
                                               daemon=True)
        self._writer_thread.start()

    def unlink_after_commit(self, session_id: str) -> None:
        """In a write: the session's segment file is removed once this transaction commits."""
        self._unlink_after_commit.append(session_id)

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            batch: list[_Write] = []
            item = self._queue.get()
            while True:
                if isinstance(item, _Stop):
                    stop = True
                else:
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._settle(batch, self._apply(batch))
            self._maybe_checkpoint(force=stop)
        self._segments.close()
        self._db.close()

    def _apply(self, batch: Sequence[_Write]) -> list[tuple[Any, BaseException | None]]:
        """Run ``batch`` in one transaction; when it fails, each write alone in its own."""
        db = self._db
        self._segments.begin()
        try:
            db.execute("BEGIN IMMEDIATE")
            results = [write.apply(db) for write in batch]
            if self.durable:
                self._segments.flush()  # the bytes the rows point at are on disk before the rows
            db.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            self._segments.rollback()
            self._unlink_after_commit.clear()
            if len(batch) == 1:
                return [(None, exc)]
            return [self._apply([write])[0] for write in batch]
        for session_id in self._unlink_after_commit:
            self._segments.remove(session_id)
        self._unlink_after_commit.clear()
        self.transactions += 1
        return [(result, None) for result in results]

    def _settle(self, batch: Sequence[_Write], results: Sequence[tuple[Any, BaseException | None]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Write, Any, BaseException | None]]] = {}
        for write, (result, error) in zip(batch, results, strict=True):
            by_loop.setdefault(write.loop, []).append((write, result, error))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve_all, settled)

    def _maybe_checkpoint(self, *, force: bool) -> None:
        if self.wal_bytes == 0 or not (force or self.wal_bytes >= 4 * CHECKPOINT_BYTES
                                        or (self.wal_bytes >= CHECKPOINT_BYTES and self._queue.empty())):
            return
        with contextlib.suppress(sqlite3.Error, OSError):
            self._segments.sync()  # the rows the checkpoint makes durable have their bytes on disk
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self.wal_bytes = 0
            self.checkpoints += 1

    def submit_write(self, apply: Callable[[sqlite3.Connection], T], *,
                     settled: Callable[[BaseException | None], None] | None = None) -> asyncio.Future[T]:
        """Queue ``apply`` for the writer thread, the journal's one write path: it runs inside the
        writer's next transaction, beside whatever else is queued by then (group commit), and the
        future settles once that transaction commits (with ``apply``'s result) or fails."""
        if self._closed:
            raise RuntimeError("the journal is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Write(apply, future, loop, settled))
        return future

    async def stop(self) -> None:
        """No write after the ones queued: the writer ends its last batch, checkpoints, and closes."""
        self._closed = True
        self._queue.put(_Stop())
        await asyncio.get_running_loop().run_in_executor(None, self._writer_thread.join)


def _resolve_all(settled: Sequence[tuple[_Write, Any, BaseException | None]]) -> None:
    for write, result, error in settled:
        if write.settled is not None:
            write.settled(error)
        if write.future.done():  # cancelled by its awaiter: the write happened all the same
            continue
        if error is None:
            write.future.set_result(result)
        else:
            write.future.set_exception(error)
