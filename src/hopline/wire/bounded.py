"""Reading a body whole under a ceiling, from any async stream of byte chunks (no I/O of its own:
the caller hands in ``response.aiter_bytes()`` or the like)."""

from __future__ import annotations

from collections.abc import AsyncIterable

from hopline.budget import CEILINGS_BY_KEY


async def read_bounded(chunks: AsyncIterable[bytes], limit: int, *, ceiling: str) -> bytes:
    """The chunks joined; the read stops at the first chunk that passes ``limit`` and raises the
    :class:`LimitExceeded` of the budget key ``ceiling`` (the bytes read so far observed)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise CEILINGS_BY_KEY[ceiling].exceeded(limit, size)
        parts.append(chunk)
    return b"".join(parts)
