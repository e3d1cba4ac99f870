"""The PostgreSQL journal's statements (SPEC D-5, X): the group commit's staging table and its one
fenced move, the sizes of a row, and a failover's write-back."""

from __future__ import annotations

from hopline.store.event_groups import ENTRY_BYTES, GROUP_MAX_EVENTS

# Rows sized per query when a page is cut by bytes (a query's work, not a payload ceiling).
SIZING_ROWS = 1000
# The events a row stands for (GREATEST passes over a NULL: 1 for a plain row), and the first id.
ROW_EVENTS = f"GREATEST(1, octet_length(parts) / {ENTRY_BYTES})"
FIRST_ID = f"seq - {ROW_EVENTS} + 1"
# A group's rows land here first (binary COPY, each with its write's place in the group), then one
# INSERT ... SELECT moves those of the kept writes to events; ON COMMIT DELETE ROWS empties it at
# every commit (a rollback drops what it held). Its columns are events' own, compressed as events
# compresses (migration 4): the COPY compresses a row's data once, and the move keeps it as it is.
STAGING = "hopline_staging"
STAGING_TABLE = (f"CREATE TEMP TABLE IF NOT EXISTS {STAGING} (part INT NOT NULL, "
                 "LIKE events INCLUDING COMPRESSION) ON COMMIT DELETE ROWS")
STAGING_COPY = f"COPY {STAGING} (part, session_id, seq, type, data, crc, parts) FROM STDIN (FORMAT BINARY)"
STAGING_TYPES = ["int4", "text", "int8", "text", "bytea", "int8", "bytea"]
# After the COPY, one statement (one round trip, not three) reads the fence, moves the kept writes'
# rows to events and notifies each session's last id: a write with a row of a session whose lease
# is not this daemon's (``held`` lacks it) is left out whole. It answers the sessions held, and
# counts ``notified`` (a CTE that is not data-modifying runs only when the query reads it).


def move_statement(fence: str, where: str, answer: str) -> str:
    return (f"WITH {fence}written AS (INSERT INTO events (session_id, seq, type, data, crc, parts) "
            f"SELECT session_id, seq, type, data, crc, parts FROM {STAGING}{where} "
            "RETURNING session_id, seq), "
            "notified AS (SELECT pg_notify(%(channel)s, session_id || ' ' || max(seq)) FROM written "
            f"GROUP BY session_id) SELECT {answer}")


MOVE_FENCED = move_statement(
    "held AS (SELECT session_id FROM leases WHERE session_id = ANY(%(sessions)s) AND owner = %(owner)s "
    f"FOR SHARE), dropped AS (SELECT DISTINCT part FROM {STAGING} "
    "WHERE session_id NOT IN (SELECT session_id FROM held)), ",
    " WHERE part NOT IN (SELECT part FROM dropped)",
    "ARRAY(SELECT session_id FROM held), (SELECT count(*) FROM notified)")
MOVE = move_statement("", "", "count(*) FROM notified")



# A failover's write-back (SPEC T-10): an event a daemon still holds, stored with its own id and
# bytes unless some row already covers that id (a plain row at it, or a group row whose range holds
# it: a group is keyed by its last id and spans at most GROUP_MAX_EVENTS), or another daemon's
# write-back of it lands first.
WRITE_BACK = ("INSERT INTO events (session_id, seq, type, data, crc) "
              "SELECT %(session)s, %(seq)s, %(type)s, %(data)s, %(crc)s WHERE NOT EXISTS ("
              "SELECT 1 FROM events WHERE session_id = %(session)s AND seq >= %(seq)s "
              f"AND seq < %(seq)s + {GROUP_MAX_EVENTS} AND {FIRST_ID} <= %(seq)s) "
              "ON CONFLICT (session_id, seq) DO NOTHING")
# The runs of ids in (after, upto] that no row of a session holds, from its rows' first and last
# ids (an index scan; the runs come back, not the rows). The run past the last row is the caller's.
MISSING_RUNS = (f"SELECT prev + 1, first - 1 FROM (SELECT {FIRST_ID} AS first, "
                "COALESCE(LAG(seq) OVER (ORDER BY seq), %(after)s) AS prev FROM events "
                "WHERE session_id = %(session)s AND seq > %(after)s "
                f"AND seq < %(upto)s + {GROUP_MAX_EVENTS}) AS runs "
                "WHERE first > prev + 1 AND prev < %(upto)s")
# The last id up to ``upto`` a row of the session holds (a group may end past it).
COVERED_UP_TO = (f"SELECT LEAST(seq, %(upto)s) FROM events WHERE session_id = %(session)s "
                 f"AND seq < %(upto)s + {GROUP_MAX_EVENTS} AND {FIRST_ID} <= %(upto)s "
                 "ORDER BY seq DESC LIMIT 1")
