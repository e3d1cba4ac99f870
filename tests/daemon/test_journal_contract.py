"""The EventJournal contract (SPEC D-5, X) on both backends: the embedded SQLite journal and a real
PostgreSQL (the session's throwaway cluster, a fresh database per test): ids, durability, group
commit, byte-bounded pages exact at the limit and one byte over, prompts, failures; on PostgreSQL
also fencing by lease and the notification that wakes other daemons."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import psycopg
import pytest

from hopline.budget import Budget
from hopline.errors import LeaseLost, StoreUnavailable
from hopline.store.journal import EventJournal
from hopline.store.pg_journal import PgJournal
from hopline.store.postgres import (
    EVENTS_CHANNEL,
    OLDEST_SERVER,
    ServerTooOld,
    migrate,
    require_supported_server,
)
from hopline.store.sqlite_journal import SqliteJournal

Opener = Callable[..., Awaitable[EventJournal]]
BACKENDS = [pytest.param("sqlite", id="sqlite"),
            pytest.param("postgresql", id="postgresql", marks=pytest.mark.e2e)]  # a PostgreSQL cluster


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_journal(backend: str, request: pytest.FixtureRequest,
                       tmp_path: object) -> AsyncIterator[Opener]:
    pg_url = ""
    if backend == "postgresql":
        pg_url = request.getfixturevalue("pg_url")
        migrate(pg_url)
    journals: list[EventJournal] = []

    async def make(**kwargs: object) -> EventJournal:
        journal: EventJournal
        if backend == "postgresql":
            journal = await PgJournal(pg_url, Budget.defaults(), **kwargs).open()  # type: ignore[arg-type]
        else:
            journal = SqliteJournal(tmp_path)  # type: ignore[arg-type]
        journals.append(journal)
        return journal

    yield make
    for journal in journals:
        await journal.close()


@pytest.fixture
def pg_only(backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("several daemons: the PostgreSQL journal only")


async def test_ids_from_one_durable_and_read_back_by_another_journal(open_journal: Opener) -> None:
    journal = await open_journal()
    assert EventJournal in type(journal).__mro__  # checked against the interface by mypy
    await journal.create_session("s1", {"cwd": "/x"})
    assert journal.next_id("s1") == 1 and journal.next_id("s1") == 1  # nothing allocated
    assert await journal.append_many("s1", [("a", b'{"n":1}'), ("b", b'{"n":2}')]) == [1, 2]
    assert journal.stage("s1", "c", b'{"n":3}') == 3
    await journal.commit()
    other = await open_journal()  # another daemon
    record = await other.get_session("s1")
    assert record is not None and record.options == {"cwd": "/x"}
    assert await other.last_id("s1") == 3 and await other.count("s1", "a") == 1
    page = await other.read_page("s1", 1, max_bytes=1 << 20)
    assert [(r.seq, r.type, r.data) for r in page] == [(2, "b", b'{"n":2}'), (3, "c", b'{"n":3}')]
    assert other.next_id("s1") == 4  # opened by get_session, its last id loaded
    with pytest.raises(LookupError):
        other.next_id("never-opened")


async def test_group_commit_and_write_order(open_journal: Opener) -> None:
    journal = await open_journal()
    await journal.create_session("s1", {})
    await journal.create_session("s2", {})
    futures = []
    for i in range(50):
        journal.stage("s1" if i % 2 else "s2", "e", orjson.dumps({"i": i}))
        futures.append(journal.commit())
    await asyncio.gather(*futures)
    assert await journal.last_id("s1") == 25 and await journal.last_id("s2") == 25
    await journal.open_prompt("s1", "p1")  # after the 25 events committed before it
    assert await journal.unended_prompts() == [("s1", "p1")]
    for data in (b'["p1"]', b'"p1"', b"{not json"):  # turn ends whose data names no prompt
        journal.stage("s1", "turn_error", data)
    await journal.commit()
    assert await journal.unended_prompts() == [("s1", "p1")]
    journal.stage("s1", "turn_complete", b'{"promptId":"p1"}')
    await journal.commit()
    assert await journal.unended_prompts() == []  # ended after it: closed on the way


async def test_pages_cut_by_bytes_exactly(open_journal: Opener) -> None:
    journal = await open_journal()
    await journal.create_session("s1", {})
    await journal.append_many("s1", [("e", b"x" * 100) for _ in range(5)])
    assert [r.seq for r in await journal.read_page("s1", 0, max_bytes=300)] == [1, 2, 3]  # at the limit
    assert [r.seq for r in await journal.read_page("s1", 0, max_bytes=299)] == [1, 2]  # one byte short
    assert [r.seq for r in await journal.read_page("s1", 0, max_bytes=1)] == [1]  # progress on a big one
    assert [r.seq for r in await journal.read_page("s1", 1, upto=3, max_bytes=1 << 20)] == [2, 3]
    assert await journal.read_page("s1", 5, max_bytes=1 << 20) == []


async def test_a_failed_commit_writes_nothing_and_gives_its_ids_back(open_journal: Opener, pg_only: None,
                                                                     pg_url: str) -> None:
    journal = await open_journal()
    await journal.create_session("s1", {})
    with psycopg.connect(pg_url, autocommit=True) as conn:  # someone else wrote id 2 meanwhile
        conn.execute("INSERT INTO events (session_id, seq, type, data) VALUES ('s1', 2, 'x', '')")
    journal.stage("s1", "a", b"1")
    journal.stage("s1", "b", b"2")
    with pytest.raises(psycopg.errors.UniqueViolation):
        await journal.commit()
    assert await journal.count("s1", "a") == 0  # all or nothing
    assert journal.next_id("s1") == 1  # nothing staged after them: their ids are given out again


async def test_fenced_out_once_the_lease_is_taken(open_journal: Opener, pg_only: None, pg_url: str) -> None:
    fenced: list[tuple[str, ...]] = []
    journal = await open_journal(owner="daemon-a", on_fenced=fenced.append)
    await journal.create_session("s1", {})
    await journal.create_session("s2", {})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO leases VALUES ('s1', 'daemon-a', 1, now() + interval '10 s'), "
                     "('s2', 'daemon-a', 1, now() + interval '10 s')")
    assert await journal.append_many("s1", [("e", b"1")]) == [1]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # daemon-b adopted s1
        conn.execute("UPDATE leases SET owner = 'daemon-b', epoch = 2 WHERE session_id = 's1'")
    journal.stage("s1", "e", b"2")
    lost = journal.commit()
    journal.stage("s2", "e", b"3")
    kept = journal.commit()  # the same group: written, the fenced one is not
    with pytest.raises(LeaseLost):
        await lost
    await kept
    assert await journal.last_id("s1") == 1 and await journal.last_id("s2") == 1
    assert fenced == [("s1",)]


async def test_each_commit_notifies_the_session_and_its_last_id(open_journal: Opener, pg_only: None,
                                                                pg_url: str) -> None:
    listener = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    try:
        await listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        journal = await open_journal()
        await journal.create_session("s1", {})
        await journal.append_many("s1", [("e", b'{"secret":"payload"}'), ("e", b"{}")])
        notify = await asyncio.wait_for(anext(aiter(listener.notifies())), 10)
        assert notify.payload == "s1 2"  # the session and its last id: never the payload
    finally:
        await listener.close()


async def test_delete_session_removes_everything(open_journal: Opener) -> None:
    journal = await open_journal()
    await journal.create_session("s1", {})
    await journal.append_many("s1", [("e", b"1")])
    await journal.open_prompt("s1", "p1")
    await journal.delete_session("s1")
    assert await journal.get_session("s1") is None and await journal.last_id("s1") == 0
    assert await journal.unended_prompts() == [] and await journal.list_sessions() == []


@pytest.mark.e2e
def test_migrations_are_idempotent_under_the_advisory_lock(pg_url: str) -> None:
    import threading

    from hopline.store.postgres import MIGRATIONS, SCHEMA_VERSION, SchemaTooNew

    applied: list[list[int]] = []
    threads = [threading.Thread(target=lambda: applied.append(migrate(pg_url))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(applied, key=len) == [[], [], [version for version, _, _ in MIGRATIONS]]  # once, by one
    assert migrate(pg_url) == []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, 'from the future')",
                     (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew):
        migrate(pg_url)


def test_a_server_older_than_14_is_refused_by_name() -> None:
    """Migration 4 needs per-column compression (PostgreSQL 14): an older server is a clear error
    naming both versions, not a syntax error from the migration."""
    require_supported_server(OLDEST_SERVER)
    require_supported_server(180001)
    with pytest.raises(ServerTooOld, match=r"version 13; hopline needs 14 or later") as raised:
        require_supported_server(OLDEST_SERVER - 1)
    assert raised.value.found == 139999 and isinstance(raised.value, StoreUnavailable)


async def test_postgresql_compresses_event_data_with_lz4(open_journal: Opener, pg_only: None,
                                                        pg_url: str) -> None:
    """Migration 4 (issue 30): events' data is compressed with lz4, not pglz (this test's server is
    built with lz4); the writer's staging table compresses as events does, and the move from it
    keeps the value as it is. A plain event and a run (one row) both, read back byte for byte."""
    journal = await open_journal()
    await journal.create_session("s1", {})
    large, run = _event(1, 64 * 1024), [_event(n, 1024) for n in range(2, 12)]
    events = [("e", large), *[("e", data) for data in run]]
    assert await journal.append_many("s1", events) == list(range(1, 12))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        method = conn.execute("SELECT attcompression FROM pg_attribute "
                              "WHERE attrelid = 'events'::regclass AND attname = 'data'").fetchone()
        stored = conn.execute("SELECT pg_column_compression(data), octet_length(data) FROM events "
                              "WHERE session_id = 's1' ORDER BY seq").fetchall()
    assert method == ("l",)
    assert [compression for compression, _ in stored] == ["lz4", "lz4"]  # the large event, the run
    assert [size for _, size in stored] == [len(large), sum(map(len, run))]
    page = await journal.read_page("s1", 0, max_bytes=1 << 20)
    assert [row.data for row in page] == [large, *run] and not any(row.corrupt for row in page)



async def test_unended_prompts_of_one_session_and_forgotten_allocations(open_journal: Opener) -> None:
    """Both backends answer the adoption's questions: one session's open prompts, and a staged but
    uncommitted event forgotten (the store's last id is the truth once get_session reads it)."""
    journal = await open_journal()
    for session_id in ("s1", "s2"):
        await journal.create_session(session_id, {})
        await journal.open_prompt(session_id, "p_" + session_id)
    assert await journal.unended_prompts("s2") == [("s2", "p_s2")]
    assert await journal.unended_prompts() == [("s1", "p_s1"), ("s2", "p_s2")]
    assert journal.stage("s1", "e", b"{}") == 1
    journal.forget_allocations("s1")
    await journal.commit()
    assert await journal.get_session("s1") is not None
    assert journal.next_id("s1") == 1 and await journal.last_id("s1") == 0


def _event(n: int, size: int) -> bytes:
    head = b'{"n":%d,"t":"' % n
    return head + b"x" * (size - len(head) - 2) + b'"}'


async def test_runs_stored_as_one_row_read_back_event_by_event_through_any_page(open_journal: Opener) -> None:
    """Runs of small events are one row in either store (store/event_groups.py); every page, wherever
    it starts and ends, and whatever its byte bound, is the events in order, each whole."""
    journal = await open_journal()
    await journal.create_session("s1", {})
    await journal.create_session("s2", {})
    sizes = [1024] * 12 + [100, 70 * 1024, 300] + [2048] * 5  # runs, a tiny one, one over a group's event
    events = [("u" if n != 14 else "v", _event(n, size)) for n, size in enumerate(sizes, 1)]
    for staged in (events[:9], events[9:]):  # two commits; s2's events interleaved with s1's
        for event_type, data in staged:
            journal.stage("s1", event_type, data)
            journal.stage("s2", "u", b'{"s2":1}')
        await journal.commit()
    assert await journal.count("s1", "u") == len(events) - 1 and await journal.count("s2", "u") == len(events)
    for after in range(len(events)):
        for upto in (after + 1, after + 7, len(events)):
            for max_bytes in (1, 3 * 1024, 1 << 30):
                page = await journal.read_page("s1", after, upto=upto, max_bytes=max_bytes)
                expected = list(enumerate(events, 1))[after:upto]
                assert [(r.seq, r.type, r.data, r.corrupt) for r in page] == [
                    (n, t, d, None) for n, (t, d) in expected[:len(page)]]
                assert page and (len(page) == 1 or sum(len(r.data) for r in page) <= max_bytes)


async def test_prompt_ends_inside_a_run_are_found(open_journal: Opener) -> None:
    journal = await open_journal()
    await journal.create_session("s1", {})
    await journal.append_many("s1", [("session_update", _event(1, 1024))])
    await journal.open_prompt("s1", "p1")
    await journal.open_prompt("s1", "p2")
    end = orjson.dumps({"promptId": "p1", "message": "x" * 600})
    await journal.append_many("s1", [("session_update", _event(n, 1024)) for n in range(3)]
                              + [("turn_error", end), ("turn_error", end.replace(b"p1", b"p3"))])
    assert await journal.unended_prompts("s1") == [("s1", "p2")]


@pytest.mark.e2e
async def test_postgresql_group_rows_are_checked_event_by_event(pg_url: str) -> None:
    """A run is one PostgreSQL row; a flipped byte of one event's bytes is said for that event
    alone, a damaged index for every id of the row, by reads, the startup check and store check."""
    from hopline.cli.store import _check_postgres
    from hopline.store.check import check_recent_events

    migrate(pg_url)
    journal = await PgJournal(pg_url, Budget.defaults()).open()
    try:
        await journal.create_session("s1", {})
        await journal.append_many("s1", [("u", _event(n, 1024)) for n in range(1, 11)])  # ids 1..10
        await journal.append_many("s1", [("u", _event(n, 1024)) for n in range(11, 16)])  # ids 11..15
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert conn.execute("SELECT seq, octet_length(parts) FROM events ORDER BY seq").fetchall() == [
                (10, 80), (15, 40)]
            conn.execute("UPDATE events SET data = overlay(data placing '\\x00'::bytea from 3 * 1024 + 20 "
                         "for 1) WHERE seq = 10")  # inside event 4
            conn.execute("UPDATE events SET parts = overlay(parts placing '\\x00'::bytea from 2 for 1) "
                         "WHERE seq = 15")
        page = await journal.read_page("s1", 0, max_bytes=1 << 30)
        damaged = [n for n in range(11, 16)] + [4]
        assert [(r.seq, r.corrupt) for r in page] == [
            (n, "checksum_mismatch" if n in damaged else None) for n in range(1, 16)]
        assert all(r.data == _event(r.seq, 1024) for r in page if r.corrupt is None)
        assert check_recent_events(pg_url) == 6
        report = _check_postgres(pg_url, False)
        assert report["eventsChecked"] == 15
        assert sorted(d["eventId"] for d in report["damagedEvents"]) == sorted(damaged)
    finally:
        await journal.close()
