"""What a failover needs of the PostgreSQL journal (SPEC T-10), on the real PostgreSQL the scale-out
tests start: a commit whose answer a lost connection took is not refused when its retry finds it
stored; a write-back stores only ids no row covers; the missing runs are exact; a statement whose
caller gave up is not run; a read past the request deadline is a 503-able error, in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from hopline.budget import Budget
from hopline.store.event_groups import inline_rows
from hopline.store.pg_journal import PgJournal
from hopline.store.postgres import StoreUnavailable, migrate

pytestmark = pytest.mark.e2e


@pytest.fixture
async def journal(pg_url: str) -> AsyncIterator[PgJournal]:
    migrate(pg_url)
    opened = await PgJournal(pg_url, Budget.defaults().replace(store_request_deadline_seconds=1.0)).open()
    try:
        yield opened
    finally:
        await opened.close()


def terminate_writer(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = 'hopline_single_journal'")


async def test_a_commit_whose_answer_was_lost_is_settled_as_committed(journal: PgJournal,
                                                                      pg_url: str) -> None:
    await journal.create_session("s", {})
    ids = [journal.stage("s", "session_update", b'{"n":%d}' % i) for i in range(3)]
    staged = list(journal._staged)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # what the first attempt committed
        for row in inline_rows(staged):
            conn.execute("INSERT INTO events (session_id, seq, type, data, crc, parts) "
                         "VALUES (%s, %s, %s, %s, %s, %s)", row)
    terminate_writer(pg_url)  # ... and the connection that would have carried its answer
    await asyncio.wait_for(journal.commit(), 30)  # retried on a new connection: already there, done
    assert await journal.last_id("s") == ids[-1]
    page = await journal.read_page("s", 0, max_bytes=1 << 20)
    assert [(r.seq, r.data) for r in page] == [(i, b'{"n":%d}' % (i - 1)) for i in ids]


async def test_a_retried_commit_that_finds_other_rows_is_refused(journal: PgJournal, pg_url: str) -> None:
    await journal.create_session("s", {})
    journal.stage("s", "session_update", b'{"n":1}')
    with psycopg.connect(pg_url, autocommit=True) as conn:  # another event under the same id
        conn.execute("INSERT INTO events (session_id, seq, type, data, crc) VALUES ('s', 1, 'x', '\\x00', 0)")
    terminate_writer(pg_url)
    with pytest.raises(psycopg.errors.UniqueViolation):
        await asyncio.wait_for(journal.commit(), 30)


async def test_write_back_stores_only_what_no_row_covers_and_missing_runs_are_exact(
        journal: PgJournal) -> None:
    await journal.create_session("s", {})
    await journal.append_many("s", [("session_update", b'{"n":%d}' % i) for i in range(1, 6)])  # a group
    await journal.write_back("s", [(9, "session_update", b'{"n":9}')])
    assert await journal.gaps("s", 0, 12) == [(6, 8), (10, 12)]
    held = [(3, "session_update", b'{"other":3}'), (7, "session_update", b'{"n":7}'),
            (9, "session_update", b'{"n":9}')]
    stored = await journal.write_back("s", held)
    assert stored == 1  # 3 is in the group row, 9 is there already: only 7 is new
    assert await journal.gaps("s", 0, 10) == [(6, 6), (8, 8), (10, 10)]
    page = await journal.read_page("s", 0, max_bytes=1 << 20)
    assert [(r.seq, r.data) for r in page] == [(i, b'{"n":%d}' % i) for i in (1, 2, 3, 4, 5, 7, 9)]
    journal.ensure_above("s", 12)
    assert journal.next_id("s") == 13  # an id a reader was given is never given again


async def test_a_read_on_a_store_that_does_not_answer_fails_within_the_deadline(
        journal: PgJournal, pg_url: str) -> None:
    await journal.create_session("s", {})
    with psycopg.connect(pg_url) as locker:  # a transaction holding the table: the reads wait on it
        locker.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="HOPLINE_STORE_REQUEST_DEADLINE_SECONDS"):
            await journal.last_id("s")
        assert time.monotonic() - started < 3.0  # the deadline is 1 s: before 3x it
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await journal.open_prompt("s", "p1")  # behind the lock too: given up, never run
        assert time.monotonic() - started < 3.0
    await asyncio.sleep(0.5)  # the writer ran it after the lock went: rolled back, as its caller was told
    assert await journal.unended_prompts("s") == []
