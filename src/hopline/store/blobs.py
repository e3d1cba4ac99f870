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

import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from hopline.store.locations import S3Options
from hopline.store.private import private_dir

READ_CHUNK_BYTES = 64 * 1024  # I/O granularity, not a ceiling
# S3 multipart part size (S3's minimum part is 5 MiB); a body goes up in parts of this size.
S3_PART_BYTES = 5 * 1024 * 1024
BLOBS_PREFIX = "blobs"


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


class _S3Handle:
    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size

    def close(self) -> None:
        pass


class S3Blobs:
    """Bodies as objects ``PREFIX/blobs/<id>`` in an S3-compatible bucket (obstore: async-capable,
    streaming get and multipart put; its sync calls run in the sidecar store's worker threads).

    Every object-store failure is raised as ``OSError`` (the store's disk-error path: a flagged,
    truncated preview, never a lost update)."""

    shared = True

    def __init__(self, options: S3Options) -> None:
        from obstore.store import S3Store

        config: dict[str, Any] = {"region": options.region or "us-east-1"}
        if options.endpoint:
            config["endpoint"] = options.endpoint
        if options.access_key_id:
            config["access_key_id"] = options.access_key_id
        if options.secret_access_key:
            config["secret_access_key"] = options.secret_access_key
        if options.session_token:
            config["token"] = options.session_token
        client: Any = {"allow_http": True} if options.allow_http else {}
        self._store = S3Store(options.bucket, prefix=options.prefix or None, client_options=client, **config)

    @staticmethod
    def _path(key: str) -> str:
        return f"{BLOBS_PREFIX}/{key}"

    @staticmethod
    def _os_error(exc: Exception) -> OSError:
        return OSError(f"object store: {type(exc).__name__}")

    def stage(self, key: str, data: bytes) -> str:
        import obstore

        view = memoryview(data)
        parts = (view[offset:offset + S3_PART_BYTES] for offset in range(0, len(view), S3_PART_BYTES))
        try:
            obstore.put(self._store, self._path(key), parts if len(view) else b"", chunk_size=S3_PART_BYTES,
                        max_concurrency=2)
        except Exception as exc:
            raise self._os_error(exc) from None
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
            meta = obstore.head(self._store, path)
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._os_error(exc) from None
        return _S3Handle(path, int(meta["size"]))

    def iter_range(self, handle: _S3Handle, start: int, stop: int) -> Iterator[bytes]:
        import obstore

        if stop <= start:
            return
        try:
            result = obstore.get(self._store, handle.path, options={"range": (start, stop)})
            for chunk in result.stream(min_chunk_size=READ_CHUNK_BYTES):
                yield bytes(chunk)
        except FileNotFoundError:
            return  # deleted meanwhile: the body ends short, the client's length check sees it
        except Exception as exc:
            raise self._os_error(exc) from None

    def delete(self, key: str) -> None:
        self._delete_path(self._path(key))

    def _delete_path(self, path: str) -> None:
        import obstore

        try:
            obstore.delete(self._store, path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._os_error(exc) from None

    def listing(self, now: float | None = None) -> Iterator[BlobInfo]:
        import obstore

        now = time.time() if now is None else now
        try:
            for batch in obstore.list(self._store, prefix=BLOBS_PREFIX + "/"):
                for meta in batch:
                    name = str(meta["path"]).rsplit("/", 1)[-1]
                    modified = meta.get("last_modified")
                    age = now - modified.timestamp() if modified is not None else float("inf")
                    yield BlobInfo(name, int(meta["size"]), age)
        except Exception as exc:
            raise self._os_error(exc) from None

    def remove_listed(self, name: str) -> bool:
        try:
            self._delete_path(f"{BLOBS_PREFIX}/{name}")
        except OSError:
            return False
        return True

    def clear_staging(self, min_age_seconds: float, now: float | None = None) -> int:
        return 0  # an object is written under its final key: nothing is staged elsewhere
