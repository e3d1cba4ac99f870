"""One sidecar (SPEC S-2): its id (minted, and checked before any I/O), its media type, its index
row, and the reasons a sidecar is refused (each with its counter under ``stats()["fallbacks"]``)."""

from __future__ import annotations

import dataclasses
import re
import secrets
from typing import Any

from hopline.budget import HOP_SIDECARS
from hopline.errors import StoreError

SIDECAR_ID_BYTES = 24
# token_urlsafe(24) -> 32 characters; \Z (not $) so a trailing newline never matches.
SIDECAR_ID_RE = re.compile(r"\A[A-Za-z0-9_-]{32}\Z")
WRITE_TOKEN_BYTES = 32
DEFAULT_MEDIA_TYPE = "application/octet-stream"
# type/subtype with optional simple parameters; anything else (CR/LF, quotes, long) is replaced.
_MEDIA_TYPE_RE = re.compile(
    r"\A[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}"
    r"(?:\s*;\s*[A-Za-z0-9_.+-]{1,32}=[A-Za-z0-9_.+-]{1,64}){0,4}\Z"
)

REASON_OVER_OBJECT = "over_object_quota"
REASON_OVER_SESSION = "over_session_quota"
REASON_OVER_STORE = "over_store_quota"
REASON_DISK_ERROR = "disk_error"  # the local disk (or the sidecar index) failed
# the object store (S3) failed, was unreachable, or did not answer within HOPLINE_OBJECT_STORE_TIMEOUT
REASON_OBJECT_STORE_UNAVAILABLE = "object_store_unavailable"
REASON_TOKEN_REVOKED = "write_token_revoked"  # the agent's token outlived its session (S-3)
# reason -> the key under stats()["fallbacks"]
FALLBACK_KEYS = {
    REASON_OVER_OBJECT: "overObjectQuota",
    REASON_OVER_SESSION: "overSessionQuota",
    REASON_OVER_STORE: "overStoreQuota",
    REASON_DISK_ERROR: "diskError",
    REASON_OBJECT_STORE_UNAVAILABLE: "objectStoreUnavailable",
    REASON_TOKEN_REVOKED: "writeTokenRevoked",
}


def is_valid_sidecar_id(value: object) -> bool:
    """True only for a string shaped exactly like an id we mint (checked before any I/O)."""
    return isinstance(value, str) and SIDECAR_ID_RE.match(value) is not None


def new_sidecar_id() -> str:
    """A new id; never one that starts with ``-``, which a command line (``hopline sidecar SESSION
    ID``) would read as an option."""
    while True:
        sidecar_id = secrets.token_urlsafe(SIDECAR_ID_BYTES)
        if not sidecar_id.startswith("-"):
            return sidecar_id


def safe_media_type(value: object) -> str:
    """The media type if it is a plain ``type/subtype[; k=v]``, else ``application/octet-stream``."""
    if isinstance(value, str) and _MEDIA_TYPE_RE.match(value):
        return value
    return DEFAULT_MEDIA_TYPE


class SidecarRefused(StoreError):
    """A sidecar was not stored: ``reason`` is one of the ``REASON_*`` values.

    ``limit`` is the ceiling that was hit (``None`` for a disk or object-store error) and ``observed``
    the size the store would have reached (for quotas) or the object size (for a storage error).
    """

    def __init__(self, reason: str, limit: int | None, observed: int) -> None:
        self.reason = reason
        self.limit = limit
        self.observed = observed
        limit_text = f"no limit ({reason.replace('_', ' ')})" if limit is None else f"limit {limit} bytes"
        super().__init__(
            f"{HOP_SIDECARS}: sidecar refused ({reason}): {limit_text}, observed {observed} bytes")


@dataclasses.dataclass(frozen=True)
class SidecarEntry:
    """One stored sidecar, as its index row says."""

    id: str
    session_id: str
    size: int
    sha256: str
    media_type: str
    created_at: float  # on the index's clock (sidecars/expiry.py), as is:
    expires_at: float  # the earliest it may expire (its session's activity moves the real moment on)

    @property
    def etag(self) -> str:
        return f'"{self.sha256}"'

    def meta(self, field: str) -> dict[str, Any]:
        """The ``_meta["hopline.sidecar"]`` list entry for ``field`` (no session id: it is implied)."""
        return {"field": field, "id": self.id, "bytes": self.size, "sha256": self.sha256,
                "mediaType": self.media_type}

