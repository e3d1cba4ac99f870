"""Sidecar bodies behind one interface (SPEC S-2, X): files under a directory, or objects in an
S3-compatible bucket. The sidecar store keeps the index and the quotas; this module only moves bytes,
streamed both ways (a body is written in chunks and read back in chunks, never copied whole).

Writing is two steps around the index transaction, so that a visible index row always has its
complete body: :meth:`BlobStore.stage` writes the body (files: a temp file, fsynced; S3: the object
under its final key) before the transaction, :meth:`BlobStore.publish` makes it visible inside it
(files: the rename; S3: nothing left to do), :meth:`BlobStore.discard` removes a staged body whose
row was refused. Keys are sidecar ids, validated by the store before they reach this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import os
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from hopline.budget import CEILINGS_BY_KEY
from hopline.errors import ObjectStoreUnavailable
from hopline.store.locations import S3Options
from hopline.store.private import private_dir

READ_CHUNK_BYTES = 64 * 1024  # I/O granularity, not a ceiling
# S3 multipart part size (S3's minimum part is 5 MiB); a body goes up in parts of this size.
S3_PART_BYTES = 5 * 1024 * 1024
# A download reads its object in ranged requests of this size, each under the object-store deadline
# (I/O granularity, not a ceiling: what one download holds in memory at a time).
S3_READ_PIECE_BYTES = 1024 * 1024
BLOBS_PREFIX = "blobs"
_TIMEOUT_SETTING = CEILINGS_BY_KEY["object_store_timeout_seconds"].name
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class BlobInfo:
    """One stored body as a listing shows it: ``size`` None for what is not a regular body."""

    name: str
    size: int | None
    age_seconds: float


class BlobStore(Protocol):
    shared: bool  # other daemons may write here: what looks orphaned may be in flight

    def stage(self, key: str, data: bytes) -> Any:
        """Write ``data`` for ``key`` (not yet visible); raises ``OSError``."""
        ...

    def publish(self, staged: Any, key: str) -> None:
        """Make a staged body visible under ``key`` (inside the index transaction); ``OSError``."""
        ...

    def discard(self, staged: Any) -> None:
        """Remove a staged body that will not be published (best effort)."""
        ...

    def settle(self) -> None:
        """After the index committed a publish: make it durable (best effort)."""
        ...

    def open(self, key: str) -> Any | None:
        """A handle to read ``key``, or None when it is gone."""
        ...

    def iter_range(self, handle: Any, start: int, stop: int) -> Iterator[bytes]:
        """Bytes ``[start, stop)`` of an open body, in chunks; releases ``handle`` when done."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` (absent is fine); raises ``OSError``."""
        ...

    def listing(self, now: float | None = None) -> Iterator[BlobInfo]:
        """Every stored body (for the orphan collection); ages against ``now`` (the store's clock
        when several daemons share it, never one daemon's; default: this machine's)."""
        ...

    def remove_listed(self, name: str) -> bool:
        """Remove a listed entry by its name (an orphan, perhaps not id-shaped); True when removed."""
        ...

    def clear_staging(self, min_age_seconds: float, now: float | None = None) -> int:
        """Remove staged bodies at least this old (at ``now``, default this machine's clock) that were
        never published; return how many."""
        ...


class FileBlobs:
    """Bodies as files: ``root/blobs/<id>``, written in ``root/tmp/`` and renamed into place."""

    def __init__(self, root: Path, *, shared: bool = False) -> None:
        self.root = Path(root)
        self.blobs_dir = self.root / BLOBS_PREFIX
        self.tmp_dir = self.root / "tmp"
        self.shared = shared
        for directory in (self.root, self.blobs_dir, self.tmp_dir):
            private_dir(directory)

    def path(self, key: str) -> Path:
        return self.blobs_dir / key

    def stage(self, key: str, data: bytes) -> Path:
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="put-", suffix=".part")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as handle:
                view = memoryview(data)
                for offset in range(0, len(view), S3_PART_BYTES):
                    handle.write(view[offset:offset + S3_PART_BYTES])
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    def publish(self, staged: Path, key: str) -> None:
        os.replace(staged, self.path(key))

    def discard(self, staged: Path) -> None:
        with contextlib.suppress(OSError):  # else collected at the next startup
            staged.unlink(missing_ok=True)

    def settle(self) -> None:
        with contextlib.suppress(OSError):  # written and renamed; the directory fsync is best effort
            fd = os.open(self.blobs_dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def open(self, key: str) -> BinaryIO | None:
        try:
            return self.path(key).open("rb")
        except FileNotFoundError:
            return None

    def iter_range(self, handle: BinaryIO, start: int, stop: int) -> Iterator[bytes]:
        try:
            handle.seek(start)
            remaining = stop - start
            while remaining > 0:
                chunk = handle.read(min(READ_CHUNK_BYTES, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                yield chunk
        finally:
            handle.close()

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def listing(self, now: float | None = None) -> Iterator[BlobInfo]:
        now = time.time() if now is None else now
        for path in self.blobs_dir.iterdir():
            try:
                if path.is_dir() and not path.is_symlink():
                    continue  # never ours; left alone
                stat = path.stat() if path.is_file() else None
                age = now - (stat.st_mtime if stat is not None else path.lstat().st_mtime)
            except OSError:
                stat, age = None, float("inf")
            yield BlobInfo(path.name, stat.st_size if stat is not None else None, age)

    def remove_listed(self, name: str) -> bool:
        """Remove a listed entry by its name (an orphan, perhaps not id-shaped); True when removed."""
        try:
            (self.blobs_dir / name).unlink()
        except OSError:
            return False
        return True

    def clear_staging(self, min_age_seconds: float, now: float | None = None) -> int:
        removed = 0
        now = time.time() if now is None else now
        for path in self.tmp_dir.iterdir():
            try:
                if min_age_seconds > 0 and now - path.lstat().st_mtime < min_age_seconds:
                    continue
                path.unlink()
                removed += 1
            except OSError:
                pass
        return removed


_io_loop: asyncio.AbstractEventLoop | None = None
_io_loop_lock = threading.Lock()


def _object_store_loop() -> asyncio.AbstractEventLoop:
    """The one event loop (its own daemon thread) the object store's calls run on: a sync caller
    waits on a future whose coroutine ``asyncio.wait_for`` cuts at the deadline, whatever obstore's
    retries would do (a cancelled call drops its request)."""
    global _io_loop
    with _io_loop_lock:
        if _io_loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="hopline-object-store", daemon=True).start()
            _io_loop = loop
        return _io_loop


class _S3Handle:
    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size

    def close(self) -> None:
        pass


class S3Blobs:
    """Bodies as objects ``PREFIX/blobs/<id>`` in an S3-compatible bucket (obstore: ranged gets and
    multipart put; called from the sidecar store's worker threads, awaited on one loop thread).

    Every object-store call has a deadline (``HOPLINE_OBJECT_STORE_TIMEOUT``, per request) and every
    failure is raised as :class:`ObjectStoreUnavailable`, an ``OSError`` (the store's refusal path:
    a flagged, truncated preview, ``object_store_unavailable``, never a lost update)."""

    shared = True

    def __init__(self, options: S3Options, *, timeout_seconds: float) -> None:
        from obstore.store import S3Store

        self.timeout_seconds = timeout_seconds
        # Past a deadline, the store is taken as down for one more deadline: calls meanwhile fail
        # at once (an update with several large fields, and every other session's, would each wait
        # a whole deadline of their own), then the next call tries it again.
        self._down_until = 0.0
        deadline = datetime.timedelta(seconds=timeout_seconds)
        backstop = 2 * deadline

        config: dict[str, Any] = {"region": options.region or "us-east-1"}
        if options.endpoint:
            config["endpoint"] = options.endpoint
        if options.access_key_id:
            config["access_key_id"] = options.access_key_id
        if options.secret_access_key:
            config["secret_access_key"] = options.secret_access_key
        if options.session_token:
            config["token"] = options.session_token
        # The call is cut at its deadline (:meth:`_bounded`; the cancelled request is dropped, its
        # connection closed), so retries cannot stretch it; no retry starts past the deadline; and an
        # attempt ends by itself at twice the deadline (obstore's default: 30 s), a backstop only.
        client: Any = {"timeout": backstop, "connect_timeout": backstop}
        if options.allow_http:
            client["allow_http"] = True
        retry: Any = {"retry_timeout": deadline,
                      "backoff": {"max_backoff": datetime.timedelta(seconds=max(timeout_seconds / 4, 0.01))}}
        self._store = S3Store(options.bucket, prefix=options.prefix or None, client_options=client,
                              retry_config=retry, **config)

    @staticmethod
    def _path(key: str) -> str:
        return f"{BLOBS_PREFIX}/{key}"

    def _bounded(self, call: Callable[[], Awaitable[_T]], requests: int = 1, *, absent: bool = False) -> _T:
        """``call()``'s result, awaited on the object store's loop within ``requests`` deadlines;
        with ``absent``, ``FileNotFoundError`` for an absent object (``StopAsyncIteration`` past a
        listing's last page); :class:`ObjectStoreUnavailable` for anything else (a write's missing
        bucket too)."""
        deadline = self.timeout_seconds * requests
        down_for = self._down_until - time.monotonic()
        if down_for > 0:
            raise ObjectStoreUnavailable(
                f"the object store passed its deadline of {self.timeout_seconds:g} s ({_TIMEOUT_SETTING}) "
                f"moments ago; calls fail at once for {down_for:.1f} s more", down_for)

        async def run() -> _T:
            return await asyncio.wait_for(call(), deadline)

        future = asyncio.run_coroutine_threadsafe(run(), _object_store_loop())
        try:
            return future.result(timeout=deadline + 1.0)  # wait_for ends it first; a stuck loop too
        except StopAsyncIteration:
            raise
        except FileNotFoundError:
            if absent:
                raise
            raise ObjectStoreUnavailable("the object store failed (its bucket is missing)",
                                         self.timeout_seconds) from None
        except TimeoutError:
            future.cancel()
            self._down_until = time.monotonic() + self.timeout_seconds
            raise ObjectStoreUnavailable(
                f"the object store did not answer within {deadline:g} s ({_TIMEOUT_SETTING})",
                self.timeout_seconds) from None
        except Exception as exc:
            raise ObjectStoreUnavailable(f"the object store failed ({type(exc).__name__})",
                                         self.timeout_seconds) from None

    def stage(self, key: str, data: bytes) -> str:
        import obstore

        view = memoryview(data)
        parts = [view[offset:offset + S3_PART_BYTES] for offset in range(0, len(view), S3_PART_BYTES)]
        # one deadline per request: the parts, and a multipart upload's start and completion
        requests = 1 if len(parts) <= 1 else len(parts) + 2
        self._bounded(functools.partial(obstore.put_async, self._store, self._path(key), parts or b"",
                                        chunk_size=S3_PART_BYTES, max_concurrency=2), requests)
        return key

    def publish(self, staged: str, key: str) -> None:
        return None  # the object is in place since stage()

    def discard(self, staged: str) -> None:
        with contextlib.suppress(OSError):  # else collected by a later orphan collection
            self.delete(staged)

    def settle(self) -> None:
        return None

    def open(self, key: str) -> _S3Handle | None:
        import obstore

        path = self._path(key)
        try:
            meta = self._bounded(functools.partial(obstore.head_async, self._store, path), absent=True)
        except FileNotFoundError:
            return None
        return _S3Handle(path, int(meta["size"]))

    def iter_range(self, handle: _S3Handle, start: int, stop: int) -> Iterator[bytes]:
        """In ranged requests of :data:`S3_READ_PIECE_BYTES`, each within the deadline (a slow client
        waits between requests, never inside one)."""
        import obstore

        offset = start
        while offset < stop:
            end = min(offset + S3_READ_PIECE_BYTES, stop)
            try:
                piece = self._bounded(functools.partial(obstore.get_range_async, self._store, handle.path,
                                                        start=offset, end=end), absent=True)
            except FileNotFoundError:
                return  # deleted meanwhile: the body ends short, the client's length check sees it
            if len(piece) == 0:
                return
            offset += len(piece)
            yield bytes(piece)

    def delete(self, key: str) -> None:
        self._delete_path(self._path(key))

    def _delete_path(self, path: str) -> None:
        import obstore

        with contextlib.suppress(FileNotFoundError):
            self._bounded(functools.partial(obstore.delete_async, self._store, path), absent=True)

    def listing(self, now: float | None = None) -> Iterator[BlobInfo]:
        """Page by page, each page one request within the deadline."""
        import obstore

        now = time.time() if now is None else now
        stream = obstore.list(self._store, prefix=BLOBS_PREFIX + "/")
        while True:
            try:
                batch = self._bounded(stream.__anext__)
            except StopAsyncIteration:
                return
            for meta in batch:
                name = str(meta["path"]).rsplit("/", 1)[-1]
                modified = meta.get("last_modified")
                age = now - modified.timestamp() if modified is not None else float("inf")
                yield BlobInfo(name, int(meta["size"]), age)

    def remove_listed(self, name: str) -> bool:
        try:
            self._delete_path(f"{BLOBS_PREFIX}/{name}")
        except OSError:
            return False
        return True

    def clear_staging(self, min_age_seconds: float, now: float | None = None) -> int:
        return 0  # an object is written under its final key: nothing is staged elsewhere
