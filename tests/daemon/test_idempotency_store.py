"""Idempotency keys in the journal (SPEC T-12, store/idempotency.py) on both backends: the embedded
SQLite journal and a real PostgreSQL (a fresh database per test). A key is stored in the same
transaction as what its write creates, or not at all; a live key refuses a second write that would
store it; an expired one is replaced; keys go with their session and when purged; the count the
daemon checks the ceiling against stays the rows' count; a damaged row is refused on read."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

from hopline.budget import Budget
from hopline.errors import KeyRecordDamaged, KeyTaken
from hopline.store.idempotency import KeyRecord
from hopline.store.journal import EventJournal
from hopline.store.pg_journal import PgJournal
from hopline.store.postgres import migrate
from hopline.store.sqlite_journal import SqliteJournal

Opener = Callable[[], Awaitable[EventJournal]]


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"),
                        pytest.param("postgresql", id="postgresql", marks=pytest.mark.e2e)])
async def journal_and_sql(request: pytest.FixtureRequest,
                          tmp_path: Path) -> AsyncIterator[tuple[EventJournal, Callable[[str], None]]]:
    """A journal, and a way to run a statement on its store behind its back (damage, counts)."""
    journal: EventJournal
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
        migrate(url)
        journal = await PgJournal(url, Budget.defaults()).open()

        def run(sql: str) -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql)
    else:
        journal = SqliteJournal(tmp_path)

        def run(sql: str) -> None:
            import sqlite3

            with sqlite3.connect(tmp_path / "journal.sqlite3") as db:
                db.execute(sql)
    try:
        yield journal, run
    finally:
        await journal.close()


def record(key: str, session_id: str, *, answer: bytes = b'{"promptId":"p_1"}', ttl: float = 60.0,
           now: float | None = None) -> KeyRecord:
    now = time.time() if now is None else now
    return KeyRecord(key, b"f" * 32, session_id, 202, answer, now, now + ttl)


async def test_a_key_is_stored_with_what_it_creates_or_not_at_all(
        journal_and_sql: tuple[EventJournal, Callable[[str], None]]) -> None:
    journal, _ = journal_and_sql
    now = time.time()
    assert (await journal.find_key("k1", now)).record is None
    first = record("k1", "s1", answer=b'{"sessionId":"s1"}')
    await journal.create_session("s1", {"cwd": "/"}, first)
    found = await journal.find_key("k1", now)
    assert found.record is not None and found.stored == 1
    assert (found.record.answer, found.record.status, found.record.session_id) == (first.answer, 202, "s1")
    assert found.record.fingerprint == first.fingerprint and found.record.expires_at == first.expires_at
    with pytest.raises(KeyTaken):  # the key is live: the second create stores nothing
        await journal.create_session("s2", {"cwd": "/"}, record("k1", "s2"))
    assert await journal.get_session("s2") is None
    await journal.open_prompt("s1", "p_1", record("k2", "s1"))
    with pytest.raises(KeyTaken):
        await journal.open_prompt("s1", "p_2", record("k2", "s1"))
    assert await journal.unended_prompts("s1") == [("s1", "p_1")]
    # with events: one transaction; a key already live does not fail the events' commit
    journal.stage("s1", "cancel_requested", b'{"promptId":null}')
    await journal.commit(record("k3", "s1", answer=b'{"cancelled":false}'))
    journal.stage("s1", "cancel_requested", b'{"promptId":null}')
    await journal.commit(record("k3", "s1", answer=b'{"cancelled":true}'))
    assert await journal.count("s1", "cancel_requested") == 2
    kept = (await journal.find_key("k3", now)).record
    assert kept is not None and kept.answer == b'{"cancelled":false}'
    assert (await journal.find_key("k3", now)).stored == 3


async def test_expired_keys_are_replaced_purged_and_go_with_their_session(
        journal_and_sql: tuple[EventJournal, Callable[[str], None]]) -> None:
    journal, run = journal_and_sql
    now = time.time()
    await journal.create_session("s1", {"cwd": "/"}, record("old", "s1", ttl=1.0, now=now - 10))
    await journal.create_session("s2", {"cwd": "/"}, record("live", "s2"))
    await journal.open_prompt("s2", "p_1", record("s2-prompt", "s2"))
    assert (await journal.find_key("old", now)).record is None  # expired: not found
    assert (await journal.find_key("old", now - 9.5)).record is not None
    await journal.open_prompt("s1", "p_9", record("old", "s1", answer=b'{"promptId":"p_9"}', now=now))
    replaced = (await journal.find_key("old", now)).record
    assert replaced is not None and replaced.answer == b'{"promptId":"p_9"}'
    assert (await journal.find_key("old", now)).stored == 3  # replaced, not added
    assert await journal.purge_keys(now + 3600) == 3
    assert (await journal.find_key("live", now)).stored == 0
    await journal.open_prompt("s2", "p_2", record("again", "s2"))
    await journal.create_session("s3", {"cwd": "/"}, record("other", "s3"))
    await journal.delete_session("s2")
    found = await journal.find_key("other", now)
    assert found.record is not None and found.stored == 1
    assert await journal.purge_keys(now) == 0  # nothing expired
    run("UPDATE idempotency_keys SET answer = answer || 'x'")  # the stored bytes no longer check
    with pytest.raises(KeyRecordDamaged):
        await journal.find_key("other", now)
