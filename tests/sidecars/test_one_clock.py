"""One clock for a shared sidecar index (SPEC X, issue 27): its times are the store's ``now()``,
never a daemon's wall clock. A daemon whose clock runs 24 h ahead (an injected time source) writes
the same times as the others and reaps nobody's sidecars."""

from __future__ import annotations

import time
from pathlib import Path

from hopline.budget import Budget
from hopline.sidecars.store import SidecarStore
from hopline.store.postgres import migrate

DAY = 86400.0


def test_a_daemon_24h_ahead_writes_store_times_and_reaps_nothing(pg_url: str, tmp_path: Path) -> None:
    migrate(pg_url)
    budget = Budget.defaults()
    honest = SidecarStore(tmp_path / "sidecars", budget, dsn=pg_url)
    skewed = None
    try:
        first = honest.put("s1", b"a" * 10, "text/plain")
        skewed = SidecarStore(tmp_path / "sidecars", budget, dsn=pg_url,
                              clock=lambda: time.time() + DAY)  # this daemon's clock, a day ahead
        second = skewed.put("s2", b"b" * 10, "text/plain")
        assert abs(second.created_at - first.created_at) < DAY / 2  # the store's clock, not the skew
        assert second.expires_at - second.created_at == budget.sidecar_ttl_seconds
        assert skewed.reap_expired() == 0  # nothing is past its TTL by the store's clock
        assert skewed.get("s1", first.id) is not None and skewed.get("s2", second.id) is not None
        assert skewed.collect_orphans() == 0  # and no body looks old enough to be an orphan
    finally:
        honest.close()
        if skewed is not None:
            skewed.close()


def test_a_shared_index_counts_on_the_stores_clock_and_keeps_a_session_leased_elsewhere(
        pg_url: str, tmp_path: Path) -> None:
    """A session another daemon holds a live lease on is live: its sidecars stay past their time
    to live by the store's clock; once its lease has expired they go with the others."""
    import psycopg

    migrate(pg_url)
    budget = Budget.defaults()
    store = SidecarStore(tmp_path / "sidecars", budget, dsn=pg_url)
    try:
        leased = store.put("leased", b"a" * 10, "text/plain")
        idle = store.put("idle", b"b" * 10, "text/plain")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("INSERT INTO leases (session_id, owner, epoch, expires_at) "
                         "VALUES ('leased', 'd_other', 1, now() + interval '1 hour')")
        later = store.clock() + budget.sidecar_ttl_seconds + 1
        assert store.reap_expired(now=later) == 1
        assert store.get("idle", idle.id) is None and store.get("leased", leased.id) == leased
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE leases SET expires_at = now() - interval '1 second' "
                         "WHERE session_id = 'leased'")
        assert store.reap_expired(now=later) == 1 and store.get("leased", leased.id) is None
    finally:
        store.close()
