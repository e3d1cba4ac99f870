"""The settings that are not ceilings (SPEC X): where the state lives, and the cluster; a URL with
its password hidden (:func:`redact_url`)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Setting:
    """One configuration setting that is a URL or a credential, not a ceiling: its key, env var,
    command-line option and what it does. Empty means its default (said in ``description``)."""

    key: str
    env: str
    description: str
    option: str | None = None
    secret: bool = False  # never shown: `hopline limits` says only whether it is set

    @property
    def name(self) -> str:
        return self.env


SETTINGS: tuple[Setting, ...] = (
    Setting("store_url", "HOPLINE_STORE_URL",
            "journal, sessions, leases and the sidecar index: sqlite:///PATH (default: journal.sqlite3 "
            "under the data dir) or postgresql://USER:PASS@HOST:PORT/DB (several daemons)", option="--store"),
    Setting("store_sync", "HOPLINE_STORE_SYNC",
            "how an SQLite store syncs: full (the default: an acknowledged write survives a power loss; "
            "SQLite synchronous=FULL, segment files fsynced with each commit) or normal (synced at "
            "checkpoints only: a power loss may lose the last commits; a daemon crash loses nothing)"),
    Setting("sidecar_url", "HOPLINE_SIDECAR_URL",
            "sidecar bodies: file://PATH (default: sidecars/ under the data dir) or s3://BUCKET/PREFIX "
            "(with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)"),
    Setting("advertise_url", "HOPLINE_ADVERTISE_URL",
            "this daemon's URL as the other daemons reach it; writes for its sessions are forwarded "
            "there (default: the URL it listens on)"),
    Setting("cluster_token", "HOPLINE_CLUSTER_TOKEN",
            "the credential daemons forward writes to each other with (required with a postgresql "
            "store; the same on every daemon)", secret=True),
)
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


@dataclasses.dataclass(frozen=True)
class Settings:
    """The values of :data:`SETTINGS` in force ("" for a default)."""

    store_url: str = dataclasses.field(default="", repr=False)  # may carry a password
    store_sync: str = ""
    sidecar_url: str = ""
    advertise_url: str = ""
    cluster_token: str = dataclasses.field(default="", repr=False)
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: str) -> Settings:
        """Read every setting from ``environ``; a non-empty ``overrides`` value (a command-line
        option) wins over its variable."""
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        sources: dict[str, str] = {}
        for setting in SETTINGS:
            override = overrides.get(setting.key, "")
            raw = env.get(setting.env, "").strip()
            if override:
                values[setting.key], sources[setting.key] = override.strip(), setting.option or "override"
            elif raw:
                values[setting.key], sources[setting.key] = raw, setting.env
        return cls(**values, sources=sources)

    def source(self, key: str) -> str:
        return self.sources.get(key, "default")

    def shown(self, key: str) -> str:
        """The value as `hopline limits` and `/daemon/status` show it: never a secret or a password."""
        value: str = getattr(self, key)
        if SETTINGS_BY_KEY[key].secret:
            return "set" if value else "unset"
        return redact_url(value) if value else "default"
