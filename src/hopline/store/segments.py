"""The SQLite journal's segment files (SPEC D-5, T-3): event data over a few hundred bytes, appended
one file per session, and read back checked.

A row that points into a segment file holds the offset, the size and the CRC-32 of its bytes
(:mod:`hopline.store.integrity`): a file that was truncated, deleted, overwritten, or an offset
that moved, is caught on read and said (the row comes back with its reason, never its bytes).
Files and their directory are private (0600 / 0700, whatever the umask).

The writer keeps only the newest pages of each file in the page cache (:data:`CACHE_STEP_BYTES`):
written data is read back rarely (the bus's ring holds the recent events), so each step behind the
end is handed back to the kernel once it is written out, and the next appends reuse those pages.
On a VM whose host takes back free guest memory, an append into pages the kernel has to take fresh
costs many times the CPU of one into reused pages; and a daemon relaying gigabytes does not fill the
page cache with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from hopline.store.event_groups import events_of
from hopline.store.integrity import (
    CHECKSUM_MISMATCH,
    QUARANTINED,
    QUARANTINED_CRC,
    SEGMENT_MISSING,
    SEGMENT_SHORT,
    verified,
)
from hopline.store.private import private_dir

# I/O granularity, not a limit: contiguous external events smaller than this are read in one pread
# per run and sliced (a replay page of 1 KiB events is then one read, not thousands); a larger one
# is read alone, into its own buffer (no second copy of it).
READ_RUN_MAX_EVENT_BYTES = 64 * 1024
OPEN_SEGMENTS = 64  # the writer's open segment files (the least recently written are closed)
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16  # buffers per writev
SEGMENT_SUFFIX = ".seg"
# Page-cache granularity, not a limit: every time a file grows by this much, the kernel is asked
# (POSIX_FADV_DONTNEED) to write out and drop its pages up to the previous such point; so the
# newest one to two steps of each open file stay cached, and the older ones go once written out.
CACHE_STEP_BYTES = 1024 * 1024
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if "SC_PAGE_SIZE" in os.sysconf_names else 4096
_fadvise = getattr(os, "posix_fadvise", None)  # absent on macOS: the pages stay cached there

R = TypeVar("R")
# (seq, type, data, corrupt reason or None) -> the caller's row type
RowFactory = Callable[[int, str, bytes, "str | None"], R]


def segment_path(root: Path, session_id: str) -> Path:
    return root / (segment_name(session_id) + SEGMENT_SUFFIX)


def segment_name(session_id: str) -> str:
    """The segment file's stem: a hash of the session id (any id is a safe file name)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:32]


class SegmentWriter:
    """The writer thread's segment files: append-only, one per session, named by a hash of the
    session id (any id is a safe file name)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, int] = {}  # in order of last write (the oldest first)
        self._unsynced: set[str] = set()
        # The transaction's: each file's end before its first append (a rollback cuts it back there),
        # and whether a file was created (its directory entry is synced with the data).
        self._marks: dict[str, int] = {}
        self._created = False
        # per open file: (the offset its pages are dropped from, the last step's point)
        self._cached: dict[str, tuple[int, int]] = {}

    def append(self, session_id: str, datas: Sequence[bytes]) -> int:
        """Write ``datas`` one after the other at the end of the session's file, in as few
        ``writev`` calls as it takes; return the offset of the first."""
        fd = self._fds.pop(session_id, None)
        if fd is None:
            private_dir(self.root)
            path = segment_path(self.root, session_id)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                self._created = True
            except FileExistsError:
                fd = os.open(path, os.O_WRONLY, 0o600)
            while len(self._fds) >= OPEN_SEGMENTS:
                self._close(next(iter(self._fds)))
        self._fds[session_id] = fd
        offset = os.lseek(fd, 0, os.SEEK_END)
        self._marks.setdefault(session_id, offset)
        pending: list[bytes | memoryview] = list(datas)
        first = 0  # pending[first:] is still to write
        try:
            while first < len(pending):
                written = os.writev(fd, pending[first:first + _IOV_MAX])
                while first < len(pending) and written >= len(pending[first]):
                    written -= len(pending[first])
                    first += 1
                if written:  # a short write: the rest of that buffer comes next
                    pending[first] = memoryview(pending[first])[written:]
        except OSError:
            with contextlib.suppress(OSError):  # a failed append leaves nothing of itself behind
                os.ftruncate(fd, offset)
            raise
        self._unsynced.add(session_id)
        end = offset + sum(len(data) for data in datas)
        start, mark = self._cached.get(session_id, (0, 0))
        if end - mark >= CACHE_STEP_BYTES:
            # Pages up to the previous mark had a step's time to be written out (this call starts
            # the writeback of the ones since); the kernel drops those that are clean.
            point = end - end % _PAGE_BYTES  # the last partial page stays: the next append fills it
            self._drop(fd, start, point)
            self._cached[session_id] = (mark, point)
        return offset

    def begin(self) -> None:
        """A transaction starts: what it appends is cut back by :meth:`rollback`."""
        self._marks.clear()

    def rollback(self) -> None:
        """The transaction failed: each file it appended to is cut back to where it ended before,
        so a file holds committed records only (and, after a crash, what was being committed)."""
        for session_id, mark in self._marks.items():
            fd = self._fds.get(session_id)
            with contextlib.suppress(OSError):
                if fd is not None:
                    os.ftruncate(fd, mark)
                else:
                    os.truncate(segment_path(self.root, session_id), mark)
            self._cached.pop(session_id, None)
        self._marks.clear()

    def flush(self) -> None:
        """Make what was appended durable (``fdatasync`` each file written since, and the
        directory when a file was created): before the transaction that points at it commits."""
        for session_id in list(self._unsynced):
            fd = self._fds.get(session_id)
            if fd is not None:
                os.fdatasync(fd)
        self._unsynced.clear()
        if self._created:
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._created = False

    def sync(self) -> None:
        for session_id in list(self._unsynced):
            fd = self._fds.get(session_id)
            if fd is not None:
                self._sync(session_id, fd)
        self._unsynced.clear()

    def _sync(self, session_id: str, fd: int) -> None:
        """fsync, then drop the file's whole pages (clean now, so they go; from its start, so
        the pages a step's drop found still in writeback go too: syncs are rare)."""
        os.fsync(fd)
        end = os.lseek(fd, 0, os.SEEK_END)
        point = end - end % _PAGE_BYTES
        self._drop(fd, 0, point)
        self._cached[session_id] = (point, point)

    @staticmethod
    def _drop(fd: int, start: int, stop: int) -> None:
        if _fadvise is not None and stop > start:
            _fadvise(fd, start, stop - start, os.POSIX_FADV_DONTNEED)

    def _close(self, session_id: str) -> None:
        fd = self._fds.pop(session_id)
        if session_id in self._unsynced:
            self._sync(session_id, fd)
            self._unsynced.discard(session_id)
        self._cached.pop(session_id, None)
        os.close(fd)

    def remove(self, session_id: str) -> None:
        fd = self._fds.pop(session_id, None)
        if fd is not None:
            os.close(fd)
        self._unsynced.discard(session_id)
        self._marks.pop(session_id, None)
        self._cached.pop(session_id, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment_path(self.root, session_id))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sync()
        for session_id in list(self._fds):
            os.close(self._fds.pop(session_id))
        self._cached.clear()


def read_rows(root: Path, session_id: str, rows: Sequence[tuple[Any, ...]], make: RowFactory[R], *,
              after: int = 0, upto: int | None = None) -> list[R]:
    """``(seq, type, data, ext_offset, ext_bytes, crc)`` rows as ``make(seq, type, data, corrupt)``,
    the external ones' data read from the session's segment file: small events that lie end to end
    in it (a session's events are appended in order) in one read per run, each larger one in a
    read of its own. A group row is its events (:mod:`~hopline.store.event_groups`); only the
    events ``after < id <= upto`` are made (a group may straddle either). Every event's bytes are
    checked against its CRC; a damaged one is made with its reason and no bytes, and the reading
    goes on."""
    reader = _SegmentReader(segment_path(root, session_id), make)
    try:
        for seq, event_type, data, offset, nbytes, crc, damaged in events_of(rows, after, upto):
            if damaged is not None:
                reader.flush()
                reader.out.append(make(seq, event_type, b"", damaged))
                continue
            if offset is None:
                reader.flush()
                bad = (None if verified(data, crc) else
                       QUARANTINED if crc == QUARANTINED_CRC else CHECKSUM_MISMATCH)
                reader.out.append(make(seq, event_type, b"" if bad else data, bad))
                continue
            run = reader.run
            if run and (offset != run[-1][2] + run[-1][3] or nbytes >= READ_RUN_MAX_EVENT_BYTES):
                reader.flush()
            run.append((seq, event_type, offset, nbytes, crc))
            if nbytes >= READ_RUN_MAX_EVENT_BYTES:
                reader.flush()
        reader.flush()
    finally:
        reader.close()
    return reader.out


class _SegmentReader(Generic[R]):
    """:func:`read_rows`'s state: the segment file, opened on the first external event, and the
    run of contiguous events read at once. A class, not closures: compiled (mypyc), closures and
    their environment form a cycle that would keep a page's bytes until the collector runs."""

    def __init__(self, path: Path, make: RowFactory[R]) -> None:
        self.path = path
        self.make = make
        self.fd: int | None = None
        self.missing = False
        self.run: list[tuple[int, str, int, int, Any]] = []  # (seq, type, offset, size, crc), contiguous
        self.out: list[R] = []

    def read(self, offset: int, nbytes: int) -> bytes | None:
        """The bytes, or None when the file is gone (``missing``) or ends before them."""
        if self.fd is None and not self.missing:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                self.missing = True
        if self.fd is None:
            return None
        data = os.pread(self.fd, nbytes, offset)
        return data if len(data) == nbytes else None

    def checked(self, seq: int, event_type: str, data: bytes | None, crc: Any) -> R:
        if data is None:
            return self.make(seq, event_type, b"", SEGMENT_MISSING if self.missing else SEGMENT_SHORT)
        if not verified(data, crc):
            return self.make(seq, event_type, b"", CHECKSUM_MISMATCH)
        return self.make(seq, event_type, data, None)

    def flush(self) -> None:
        run, out = self.run, self.out
        if len(run) == 1:
            seq, event_type, offset, nbytes, crc = run[0]
            out.append(self.checked(seq, event_type, self.read(offset, nbytes), crc))
        elif run:
            start = run[0][2]
            whole = self.read(start, run[-1][2] + run[-1][3] - start)
            view = memoryview(whole) if whole is not None else None
            for seq, event_type, offset, nbytes, crc in run:
                data = (self.read(offset, nbytes) if view is None  # short: one by one, to find the whole ones
                        else view[offset - start:offset - start + nbytes].tobytes())
                out.append(self.checked(seq, event_type, data, crc))
        run.clear()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
