"""The settings beside the ceilings (SPEC X): where state lives, shown without secrets, and URLs that
hopline cannot use refused at start-up naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopline.budget import SETTINGS, Budget, Settings, check_coherence, limits_json, redact_url
from hopline.errors import StoreSettingError
from hopline.store.locations import sidecar_location, store_location


def test_settings_come_from_the_environment_and_the_option_wins() -> None:
    env = {"HOPLINE_STORE_URL": "postgresql://u:hunter2@db:5432/h", "HOPLINE_CLUSTER_TOKEN": "tok-123"}
    settings = Settings.from_env(env)
    assert settings.store_url == env["HOPLINE_STORE_URL"]
    assert settings.source("store_url") == "HOPLINE_STORE_URL"
    assert Settings.from_env(env, store_url="sqlite:///x.db").source("store_url") == "--store"
    assert settings.source("sidecar_url") == "default" and settings.shown("sidecar_url") == "default"


def test_limits_show_settings_without_a_secret_or_a_password() -> None:
    settings = Settings.from_env({"HOPLINE_STORE_URL": "postgresql://u:hunter2@db:5432/h",
                                  "HOPLINE_CLUSTER_TOKEN": "tok-123"})
    doc = limits_json(Budget.defaults(), check_coherence(Budget.defaults()), settings)
    rows = {row["name"]: row for row in doc["settings"]}  # type: ignore[union-attr]
    assert set(rows) == {s.env for s in SETTINGS}
    assert rows["HOPLINE_STORE_URL"]["value"] == "postgresql://u:***@db:5432/h"
    assert rows["HOPLINE_CLUSTER_TOKEN"]["value"] == "set" and "tok-123" not in str(doc)
    assert "hunter2" not in str(doc) and "hunter2" not in repr(settings)
    assert redact_url("postgresql://db:5432/h") == "postgresql://db:5432/h"
    # libpq takes a password in the query too; an unencoded "@" in one is hidden whole
    assert redact_url("postgresql://u@db/h?sslmode=off&password=hunter2") == (
        "postgresql://u@db/h?sslmode=off&password=***")
    assert redact_url("postgresql://u:hun@ter2@db/h") == "postgresql://u:***@db/h"


def test_store_and_sidecar_urls(tmp_path: Path) -> None:
    assert store_location("", tmp_path).path == tmp_path / "journal.sqlite3"
    assert store_location("sqlite:///var/h/j.db", tmp_path).path == Path("/var/h/j.db")
    assert store_location("postgresql://u:p@h:1/db", tmp_path).shared
    s3 = sidecar_location("s3://bucket/a/b", tmp_path, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                                                        "AWS_REGION": "eu-west-1"}).s3
    assert s3 is not None
    assert (s3.bucket, s3.prefix, s3.region, s3.allow_http) == ("bucket", "a/b", "eu-west-1", True)
    assert sidecar_location("file:///srv/sc", tmp_path, {}).path == Path("/srv/sc")


@pytest.mark.parametrize(("store", "sidecars", "named"), [
    ("mysql://u:secretpw@h/db", "", "HOPLINE_STORE_URL"),
    ("sqlite://relative.db", "", "HOPLINE_STORE_URL"),
    ("postgresql://u:secretpw@h:1/", "", "HOPLINE_STORE_URL"),
    ("", "s3:///nobucket", "HOPLINE_SIDECAR_URL"),
    ("", "ftp://x/y", "HOPLINE_SIDECAR_URL"),
])
def test_an_unusable_url_is_refused_naming_its_setting(tmp_path: Path, store: str, sidecars: str,
                                                       named: str) -> None:
    with pytest.raises(StoreSettingError) as info:
        store_location(store, tmp_path)
        sidecar_location(sidecars, tmp_path, {})
    assert str(info.value).startswith(named) and "secretpw" not in str(info.value)


def test_store_sync_is_full_by_default_normal_on_request_and_anything_else_refused() -> None:
    from hopline.store.locations import store_sync

    assert store_sync("") == "full" and store_sync(Settings.from_env({}).store_sync) == "full"
    assert store_sync(Settings.from_env({"HOPLINE_STORE_SYNC": " NORMAL "}).store_sync) == "normal"
    with pytest.raises(StoreSettingError) as info:
        store_sync("off")
    assert str(info.value).startswith("HOPLINE_STORE_SYNC='off'") and "full" in str(info.value)
