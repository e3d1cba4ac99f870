"""When a sidecar goes (S-2, T-10): its session's time to live counts from the session's last
activity on the index's clock, a live session's sidecars never go, the SQLite index's clock is the
time daemons ran (persisted, monotonic), and a round of the reaper in which a clock stepped does
nothing but log it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.sidecars import expiry
from hopline.sidecars.expiry import Reaper
from hopline.sidecars.store import SidecarStore

from .conftest import CountingStore, FakeClock

StoreFactory = Callable[..., CountingStore]
TTL = 60.0


def test_the_time_to_live_counts_from_the_sessions_last_activity(make_store: StoreFactory,
                                                                 clock: FakeClock) -> None:
    store = make_store(Budget.defaults().replace(sidecar_ttl_seconds=TTL))
    old = store.put("s1", b"old", "text/plain")
    idle = store.put("s2", b"idle", "text/plain")
    clock.now += 30
    young = store.put("s1", b"young", "text/plain")  # s1 active again: its old sidecar stays too
    clock.now += 30  # s2 exactly one time to live after its last activity
    assert store.reap_expired() == 1
    assert store.get("s2", idle.id) is None and not (store.blobs_dir / idle.id).exists()
    assert store.get("s1", old.id) == old and store.get("s1", young.id) == young
    clock.now += TTL - 30 - 1
    assert store.reap_expired() == 0  # s1: one second short of its time to live
    clock.now += 1
    assert store.reap_expired() == 2 and list(store.blobs_dir.iterdir()) == []


def test_a_live_sessions_sidecars_never_expire_and_its_end_starts_the_count(make_store: StoreFactory,
                                                                            clock: FakeClock) -> None:
    store = make_store(Budget.defaults().replace(sidecar_ttl_seconds=TTL))
    entry = store.put("s1", b"kept", "text/plain")
    for _ in range(5):  # live for five times its time to live
        clock.now += TTL
        assert store.reap_expired(live=["s1"]) == 0
    assert store.read_bytes(entry) == b"kept"
    clock.now += TTL - 1  # it ended (no longer live) right after the last round
    assert store.reap_expired() == 0
    clock.now += 1
    assert store.reap_expired() == 1 and store.get("s1", entry.id) is None


def test_sidecars_from_before_activity_was_kept_count_from_the_first_round(make_store: StoreFactory,
                                                                           clock: FakeClock) -> None:
    store = make_store(Budget.defaults().replace(sidecar_ttl_seconds=TTL))
    entry = store.put("s1", b"old", "text/plain")
    store._execute("DELETE FROM sidecar_sessions")  # as an index written before kept none
    clock.now += 10 * TTL
    assert store.reap_expired() == 0  # adopted now, not aged by what its rows say
    clock.now += TTL
    assert store.reap_expired() == 1 and store.get("s1", entry.id) is None


def test_the_sqlite_index_clock_is_the_time_daemons_ran_and_goes_on_after_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "sidecars"
    first = SidecarStore(root, Budget.defaults())
    started = first.clock()
    time.sleep(0.2)
    assert first.clock() - started == pytest.approx(0.2, abs=0.15)  # it runs on the monotonic clock
    first.reap_expired()  # a round persists where it got to
    reached = first.clock()
    first.close()
    time.sleep(0.3)  # no daemon runs: the index's time stands still
    second = SidecarStore(root, Budget.defaults())
    try:
        assert reached - 0.05 <= second.clock() < reached + 0.25
    finally:
        second.close()


def test_a_round_in_which_the_wall_clock_stepped_removes_nothing_and_says_so(
        make_store: StoreFactory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(Budget.defaults().replace(sidecar_ttl_seconds=TTL))
    store.put("s1", b"x", "text/plain")
    clock.now += 2 * TTL  # expired by the index's clock
    reaper = Reaper(store, 1.0, live=list)
    real = time.time
    monkeypatch.setattr(expiry.time, "time", lambda: real() + 25 * 3600)  # the wall clock jumps a day
    with caplog.at_level(logging.WARNING, logger="hopline.sidecars"):
        assert reaper.round([]) == 0
    assert reaper.refused == 1 and store.stats()["count"] == 1
    [record] = [r for r in caplog.records if "clock stepped" in r.getMessage()]
    assert record.stepSeconds > 24 * 3600 and record.periodSeconds == 1.0  # type: ignore[attr-defined]
    assert reaper.round([]) == 1  # the next round, with no step, acts (on the index's clock)


async def test_the_reaper_runs_a_round_every_period_with_the_live_sessions_of_that_moment(
        tmp_path: Path) -> None:
    store = SidecarStore(tmp_path / "sidecars", Budget.defaults().replace(sidecar_ttl_seconds=1.0))
    live = store.put("live", b"a", "text/plain")
    gone = store.put("gone", b"b", "text/plain")
    reaper = Reaper(store, 0.05, live=lambda: {"live"})
    task = asyncio.create_task(reaper.run())
    try:
        for _ in range(300):  # a second of the index's clock, then the next round: well within 3 s
            if store.get("gone", gone.id) is None:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert store.get("gone", gone.id) is None and store.get("live", live.id) == live
    assert reaper.refused == 0
    store.close()
