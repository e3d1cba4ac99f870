"""``GET /session/{id}/transcript``: the journal read back in pages bounded by bytes (SPEC D-1).

A page holds whole events up to ``HOPLINE_TRANSCRIPT_PAGE_MAX_BYTES`` (the ``transcript_page_envelope_bytes``
of its ``{"events": [...], "nextCursor": ...}`` envelope included); an event that alone is larger
than a page is named, not inlined (``omitted``: its size and the ``Last-Event-ID`` to read it with
over SSE). ``nextCursor`` is the last id of the page while the journal holds more. A damaged event
(T-3) is named with its reason (``corrupt``, as ``data_corrupt`` says it on the stream), never served,
and the page counts them (``corrupt``); a journal that cannot be read answers 503 ``storage_unavailable``.
"""

from __future__ import annotations

import orjson

from hopline.budget import CEILINGS_BY_KEY
from hopline.daemon.storage_faults import is_storage_fault, refusal
from hopline.store.integrity import corrupt_json
from hopline.store.journal import EventJournal


async def transcript_page(journal: EventJournal, session_id: str, after: int, *, page_max_bytes: int,
                          envelope_bytes: int) -> bytes:
    """The JSON of the page of events after ``after``."""
    try:
        last_id = await journal.last_id(session_id)  # first: a page never ends past it
        rows = await journal.read_page(session_id, after, upto=last_id, max_bytes=page_max_bytes)
    except Exception as exc:
        if not is_storage_fault(exc):
            raise
        raise refusal(exc, "the transcript page") from None
    parts: list[bytes] = []
    total = envelope_bytes
    last = after
    corrupt = 0
    for row in rows:
        if row.corrupt is not None:
            piece = orjson.dumps({"id": row.seq, "type": row.type, "corrupt": corrupt_json(row)})
            if not corrupt:  # the page's count joins its envelope: ',"corrupt":' and its digits
                total += len(b',"corrupt":') + 10
        else:
            piece = b'{"id":%d,"type":%s,"data":%s}' % (row.seq, orjson.dumps(row.type), row.data)
        if len(piece) + 1 > page_max_bytes - envelope_bytes:
            over = CEILINGS_BY_KEY["transcript_page_max_bytes"].exceeded(page_max_bytes, len(row.data))
            piece = orjson.dumps({"id": row.seq, "type": row.type,
                                  "omitted": {"bytes": len(row.data), **over.fields(),
                                              "resumeWithLastEventId": row.seq - 1}})
        if parts and total + len(piece) + 1 > page_max_bytes:
            break
        parts.append(piece)
        total += len(piece) + 1
        last = row.seq
        corrupt += row.corrupt is not None
    next_cursor = str(last) if last < last_id else None
    counted = b',"corrupt":%d' % corrupt if corrupt else b""
    return b'{"events":[' + b",".join(parts) + b'],"nextCursor":' + orjson.dumps(next_cursor) + counted + b"}"
