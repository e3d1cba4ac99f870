"""The settings that are URLs or a credential, not limits (SPEC X): where the state lives, and
several daemons; a URL with its password hidden (:func:`redact_url`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Self

from pydantic import ConfigDict

from hopline.budget.declare import HopSettings, text


class Settings(HopSettings):
    """The values in force ("" for a default): each field a setting, read from its variable; a
    command-line option wins over its variable (:meth:`from_env`)."""

    model_config = ConfigDict(str_strip_whitespace=True)

    store_url: str = text("HOPLINE_STORE_URL",
                          "journal, sessions, leases and the sidecar index: sqlite:///PATH (default: "
                          "journal.sqlite3 under the data dir) or postgresql://USER:PASS@HOST:PORT/DB "
                          "(several daemons)", option="--store", common=True)
    store_sync: str = text("HOPLINE_STORE_SYNC",
                           "how an SQLite store syncs: full (the default: an acknowledged write survives a "
                           "power loss; SQLite synchronous=FULL, segment files fsynced with each commit) or "
                           "normal (synced at checkpoints only: a power loss may lose the last commits; a "
                           "daemon crash loses nothing)")
    sidecar_url: str = text("HOPLINE_SIDECAR_URL",
                            "sidecar bodies: file://PATH (default: sidecars/ under the data dir) or "
                            "s3://BUCKET/PREFIX (with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
                            "AWS_SECRET_ACCESS_KEY, AWS_REGION)")
    advertise_url: str = text("HOPLINE_ADVERTISE_URL",
                              "this daemon's URL as the other daemons reach it; writes for its sessions are "
                              "forwarded there (default: the URL it listens on)")
    cluster_token: str = text("HOPLINE_CLUSTER_TOKEN",
                              "the credential daemons forward writes to each other with (required with a "
                              "postgresql store; the same on every daemon)", secret=True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Every setting from ``environ``; a non-empty ``overrides`` value (a command-line option)
        wins over its variable."""
        given = {key: value.strip() for key, value in overrides.items() if value and value.strip()}
        settings = super().from_env(environ, **given)
        for key in given:
            settings._sources[key] = SETTINGS_BY_KEY[key].option or "override"
        return settings

    def shown(self, key: str) -> str:
        """The value as `hopline limits` and `/daemon/status` show it: never a secret or a password."""
        value: str = getattr(self, key)
        if SETTINGS_BY_KEY[key].secret:
            return "set" if value else "unset"
        return redact_url(value) if value else "default"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of :class:`Settings` as its declaration states it."""

    key: str
    env: str
    description: str
    option: str | None = None
    secret: bool = False  # never shown: `hopline limits` says only whether it is set
    common: bool = False

    @property
    def name(self) -> str:
        return self.env


def _setting(key: str) -> Setting:
    field = Settings.model_fields[key]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return Setting(key, str(field.validation_alias), field.description or "", option=extra.get("option"),  # type: ignore[arg-type]
                   secret=bool(extra.get("secret")), common=bool(extra.get("common")))


SETTINGS: tuple[Setting, ...] = tuple(_setting(key) for key in Settings.model_fields)
SETTINGS_BY_KEY: Mapping[str, Setting] = {s.key: s for s in SETTINGS}
# Settings that are credentials (a store URL may carry a password): never passed to a child, even
# when the operator names them (D-11).
SECRET_SETTINGS_ENV: frozenset[str] = frozenset({SETTINGS_BY_KEY["store_url"].env,
                                                 SETTINGS_BY_KEY["cluster_token"].env})


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (a store URL may carry one): the user info's
    (up to the last ``@`` of the authority, so an unencoded ``@`` in a password is hidden whole)
    and a libpq ``password=`` query parameter's."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority_end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
                        default=len(rest))
    authority, tail = rest[:authority_end], rest[authority_end:]
    userinfo, at, host = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = userinfo.partition(":")[0] + ":***@" + host
    tail = re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", tail)
    return f"{scheme}://{authority}{tail}"
