"""What a request to `hopline agent` carries, checked before it is used (SPEC H-10, D-11, S-3):
the session's credentials, the change under review, a workspace, a loadUpdates cursor. Each bad
value answers ``invalid_params`` naming its field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from acp import RequestError

from hopline.errors import InputRefused
from hopline.harness.tools import ReviewRange
from hopline.vocabulary import CREDENTIAL_GATEWAY_TOKEN, CREDENTIAL_SIDECAR_WRITE_TOKEN, META_CREDENTIALS
from hopline.vocabulary import REVIEW_META as META_REVIEW
from hopline.wire.input import parse_decimal_id


@dataclasses.dataclass(frozen=True)
class SessionCredentials:
    """One session's secrets from ``_meta["hopline.credentials"]`` (memory only; repr hides them)."""

    gateway_token: str | None = dataclasses.field(default=None, repr=False)
    sidecar_write_token: str | None = dataclasses.field(default=None, repr=False)


def credentials_of(meta: dict[str, Any]) -> SessionCredentials | None:
    """The credentials a ``session/new`` or ``session/load`` carries, or None when it has none."""
    given = meta.get(META_CREDENTIALS)
    if given is None:
        return None
    if not isinstance(given, dict):
        raise RequestError.invalid_params({"field": f"_meta.{META_CREDENTIALS}", "reason": "not an object"})
    tokens: dict[str, str | None] = {}
    for key in (CREDENTIAL_GATEWAY_TOKEN, CREDENTIAL_SIDECAR_WRITE_TOKEN):
        token = given.get(key)
        if token is not None and not isinstance(token, str):
            raise RequestError.invalid_params({"field": f"_meta.{META_CREDENTIALS}.{key}",
                                               "reason": "not a string"})
        tokens[key] = token or None
    return SessionCredentials(gateway_token=tokens[CREDENTIAL_GATEWAY_TOKEN],
                              sidecar_write_token=tokens[CREDENTIAL_SIDECAR_WRITE_TOKEN])


def review_of(value: Any) -> dict[str, Any]:
    """``_meta["hopline.review"]`` checked: ``{base, head}`` (two commit ids), optionally the gate's
    ``testCommand`` and ``sandbox``."""
    if not isinstance(value, dict):
        raise RequestError.invalid_params({"field": f"_meta.{META_REVIEW}",
                                           "reason": "an object with base and head"})
    try:
        return ReviewRange.from_meta(value).to_meta()
    except ValueError as exc:
        raise RequestError.invalid_params({"field": f"_meta.{META_REVIEW}", "reason": str(exc)}) from None



def cursor_of(value: Any) -> int:
    """A loadUpdates cursor: a nextCursor of ours (decimal digits, SQLite's range), or an int."""
    if value is None:
        return 0
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str):
        raise RequestError.invalid_params({"field": "cursor", "reason": "not a cursor"})
    try:
        return parse_decimal_id(text, "cursor")
    except InputRefused as refused:
        raise RequestError.invalid_params({"field": "cursor", "reason": refused.message}) from None


def workspace_of(cwd: str) -> Path:
    path = Path(cwd)
    if not path.is_absolute() or not path.is_dir():
        raise RequestError.invalid_params({"field": "cwd", "reason": "not an absolute path to a directory"})
    return path.resolve()
