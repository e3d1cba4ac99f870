"""The raw bytes of a text chunk's ``update`` inside its ``session/update`` frame (sans-IO).

A relayed update that nothing changes goes to the journal and to SSE as the agent wrote it: the
daemon splices these bytes into its envelope instead of encoding the decoded update again. Only a
frame whose bytes provably hold exactly that one value qualifies; any other spelling gives None and
the caller encodes (same JSON, its own bytes). The frame must be, byte for byte::

    {"jsonrpc":"2.0","method":"session/update","params":{"sessionId":<id>,"update":<U>}}

where ``<U>`` is ``{"sessionUpdate":<kind>,"content":{"type":"text","text":"<S>"}}`` with its two
members, and the content's two, in either order; ``<id>`` and ``<kind>`` as compact JSON strings
(what orjson, pydantic, ``json.dumps(separators=(",", ":"))`` and ``JSON.stringify`` write); and
``<S>`` without an unescaped quote. Then every byte of the frame is accounted for: the
frame parsed, so ``<S>`` is one string body, and there is no room for a second ``update`` or
``params`` member (a duplicate key would make the spliced bytes differ from the decoded message).
Checking ``<S>`` for quotes is one ``memchr`` when it has none; a text with more than
``MAX_QUOTES_CHECKED`` quotes is encoded instead (each quote's backslashes are counted).
"""

from __future__ import annotations

import functools
from typing import Any

import orjson

TEXT_CHUNK_KINDS = frozenset({"agent_message_chunk", "agent_thought_chunk", "user_message_chunk"})
# Work threshold, not a limit: below it encoding the update again is cheaper than checking its
# bytes: the check and the splice have a fixed cost that encoding passes only for large updates,
# and then encoding grows faster with the size than they do. The daemon passes frames of at least
# this size through.
PASSTHROUGH_MIN_FRAME_BYTES = 256 * 1024
MAX_QUOTES_CHECKED = 64  # work bound of the check, not a payload limit

_FRAME_HEAD = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'
_UPDATE_KEY = b',"update":'
_FRAME_TAIL = b"}}"  # closes params, then the message


@functools.lru_cache(maxsize=len(TEXT_CHUNK_KINDS))
def _update_forms(kind: str) -> tuple[tuple[bytes, bytes], ...]:
    """(before the text's body, after it) for each order of the update's and the content's two
    members: ACP's TypeScript SDK writes the first, its Python SDK the second."""
    kind_member = b'"sessionUpdate":' + orjson.dumps(kind)
    type_text, text = b'"type":"text",', b'"text":"'
    return (
        (b"{" + kind_member + b',"content":{' + type_text + text, b'"}}'),
        (b'{"content":{' + text, b'",' + type_text[:-1] + b"}," + kind_member + b"}"),
        (b"{" + kind_member + b',"content":{' + text, b'",' + type_text[:-1] + b"}}"),
        (b'{"content":{' + type_text + text, b'"},' + kind_member + b"}"),
    )


def text_chunk_update_bytes(raw: bytes, message: Any) -> memoryview | None:
    """The bytes of ``message["params"]["update"]`` in ``raw`` (the frame ``message`` was decoded
    from), or None when the frame is not one of the exact forms above."""
    if not isinstance(message, dict) or len(message) != 3:
        return None
    params = message.get("params")
    if not isinstance(params, dict) or len(params) != 2:
        return None
    update, session_id = params.get("update"), params.get("sessionId")
    if not isinstance(update, dict) or len(update) != 2 or not isinstance(session_id, str):
        return None
    kind, content = update.get("sessionUpdate"), update.get("content")
    if (kind not in TEXT_CHUNK_KINDS or not isinstance(content, dict) or len(content) != 2
            or content.get("type") != "text" or not isinstance(content.get("text"), str)):
        return None
    head = _frame_head(session_id)
    if not raw.startswith(head) or not raw.endswith(_FRAME_TAIL):
        return None
    start, end = len(head), len(raw) - len(_FRAME_TAIL)
    for before, after in _update_forms(kind):
        if (end - start >= len(before) + len(after) and raw.startswith(before, start)
                and raw.endswith(after, 0, end)):
            if not _no_unescaped_quote(raw, start + len(before), end - len(after)):
                return None
            return memoryview(raw)[start:end]
    return None


@functools.lru_cache(maxsize=256)  # a daemon's live sessions' agent ids
def _frame_head(session_id: str) -> bytes:
    return _FRAME_HEAD + orjson.dumps(session_id) + _UPDATE_KEY


def _no_unescaped_quote(raw: bytes, start: int, end: int) -> bool:
    quote = raw.find(b'"', start, end)
    checked = 0
    while quote != -1:
        checked += 1
        if checked > MAX_QUOTES_CHECKED:
            return False
        backslashes = 0
        while quote - 1 - backslashes >= start and raw[quote - 1 - backslashes] == 0x5C:
            backslashes += 1
        if backslashes % 2 == 0:
            return False
        quote = raw.find(b'"', quote + 1, end)
    return True
