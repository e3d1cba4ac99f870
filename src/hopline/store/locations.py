"""``HOPLINE_STORE_URL`` and ``HOPLINE_SIDECAR_URL`` parsed (SPEC X); a bad URL is an error naming the
setting and the URL (its password redacted), raised at start-up.

* store: ``sqlite:///PATH`` (an absolute path to the journal file; the default is
  ``journal.sqlite3`` under the data dir) or ``postgresql://USER:PASS@HOST:PORT/DB`` (also
  ``postgres://``; libpq query parameters such as ``?host=/socket/dir`` pass through);
* sidecars: ``file:///PATH`` (the default is ``sidecars/`` under the data dir) or
  ``s3://BUCKET/PREFIX``, the endpoint and the credentials from the standard ``AWS_*`` variables.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from hopline.budget import SETTINGS_BY_KEY, redact_url
from hopline.budget.variables import (
    AWS_ACCESS_KEY_ID_ENV,
    AWS_DEFAULT_REGION_ENV,
    AWS_ENDPOINT_URL_ENV,
    AWS_ENDPOINT_URL_S3_ENV,
    AWS_REGION_ENV,
    AWS_SECRET_ACCESS_KEY_ENV,
    AWS_SESSION_TOKEN_ENV,
)
from hopline.errors import StoreSettingError

JOURNAL_FILE = "journal.sqlite3"
SEGMENTS_DIR = "journal.segments"  # beside the journal file, wherever it is
QUARANTINE_DIR = "journal.quarantine"  # beside it too: what a check or a recovery moved aside
SIDECARS_DIR = "sidecars"
SQLITE = "sqlite"
POSTGRESQL = "postgresql"
FILE = "file"
S3 = "s3"


SYNC_FULL = "full"  # an acknowledged write survives a power loss
SYNC_NORMAL = "normal"  # synced at checkpoints: a power loss may lose the last commits


def store_sync(value: str) -> str:
    """``HOPLINE_STORE_SYNC`` ("" for the default, ``full``), or an error naming the setting."""
    mode = value.strip().lower() or SYNC_FULL
    if mode not in (SYNC_FULL, SYNC_NORMAL):
        raise StoreSettingError(f"{SETTINGS_BY_KEY['store_sync'].env}={value!r}: expected "
                                f"{SYNC_FULL} (the default) or {SYNC_NORMAL}")
    return mode


def journal_quarantine(journal: Path) -> Path:
    """Where one check or recovery of the journal at ``journal`` moves what it quarantines."""
    return journal.parent / QUARANTINE_DIR / time.strftime("%Y%m%dT%H%M%S")


@dataclasses.dataclass(frozen=True)
class StoreLocation:
    kind: str  # SQLITE | POSTGRESQL
    path: Path | None = None  # the SQLite journal file
    dsn: str = dataclasses.field(default="", repr=False)  # the PostgreSQL URL (may hold a password)

    @property
    def shared(self) -> bool:
        """Several daemons may open it (then sessions have owners, and the sidecar index is in it)."""
        return self.kind == POSTGRESQL


@dataclasses.dataclass(frozen=True)
class S3Options:
    """An S3-compatible bucket as ``AWS_*`` names it; ``allow_http`` follows an ``http://`` endpoint
    (moto, a local MinIO) so that those variables alone suffice."""

    bucket: str
    prefix: str
    endpoint: str | None
    region: str | None
    access_key_id: str | None = dataclasses.field(default=None, repr=False)
    secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint) and str(self.endpoint).startswith("http://")


@dataclasses.dataclass(frozen=True)
class SidecarLocation:
    kind: str  # FILE | S3
    path: Path | None = None  # FILE: the store root (index, blobs/, tmp/)
    s3: S3Options | None = None


def _error(key: str, url: str, why: str) -> StoreSettingError:
    return StoreSettingError(f"{SETTINGS_BY_KEY[key].env}={redact_url(url)!r}: {why}")


def store_location(url: str, data_dir: Path) -> StoreLocation:
    """The store named by ``url`` ("" for the default SQLite file under ``data_dir``)."""
    if not url:
        return StoreLocation(SQLITE, path=data_dir / JOURNAL_FILE)
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == SQLITE:
        if parsed.netloc or not parsed.path.startswith("/") or parsed.path == "/":
            raise _error("store_url", url, "expected sqlite:///ABSOLUTE/PATH (three slashes)")
        return StoreLocation(SQLITE, path=Path(urllib.parse.unquote(parsed.path)))
    if parsed.scheme in (POSTGRESQL, "postgres"):
        if not parsed.path.strip("/"):
            raise _error("store_url", url, "expected postgresql://USER:PASS@HOST:PORT/DB (no database named)")
        return StoreLocation(POSTGRESQL, dsn=url)
    raise _error("store_url", url, "expected sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB")


def sidecar_location(url: str, data_dir: Path, environ: Mapping[str, str]) -> SidecarLocation:
    """The sidecar bodies' place named by ``url`` ("" for ``sidecars/`` under ``data_dir``)."""
    if not url:
        return SidecarLocation(FILE, path=data_dir / SIDECARS_DIR)
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == FILE:
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise _error("sidecar_url", url, "expected file:///ABSOLUTE/PATH")
        return SidecarLocation(FILE, path=Path(urllib.parse.unquote(parsed.path)))
    if parsed.scheme == S3:
        if not parsed.netloc:
            raise _error("sidecar_url", url, "expected s3://BUCKET/PREFIX (no bucket named)")

        def env(name: str) -> str | None:
            return environ.get(name) or None

        return SidecarLocation(S3, s3=S3Options(
            bucket=parsed.netloc, prefix=parsed.path.strip("/"),
            endpoint=env(AWS_ENDPOINT_URL_S3_ENV) or env(AWS_ENDPOINT_URL_ENV),
            region=env(AWS_REGION_ENV) or env(AWS_DEFAULT_REGION_ENV),
            access_key_id=env(AWS_ACCESS_KEY_ID_ENV), secret_access_key=env(AWS_SECRET_ACCESS_KEY_ENV),
            session_token=env(AWS_SESSION_TOKEN_ENV)))
    raise _error("sidecar_url", url, "expected file:///PATH or s3://BUCKET/PREFIX")
