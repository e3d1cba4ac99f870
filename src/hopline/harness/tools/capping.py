"""Capping a tool's output for the model (SPEC H-7). Pure.

A result longer than ``HOPLINE_TOOL_RESULT_MAX_BYTES`` keeps its head and tail, with a marker in
between that tells a model in words how many bytes were cut and how to read them. The same facts
travel structured in the tool message's ``_meta["hopline.cut"]`` (:class:`Cut`): a program (the
offline reviewer) reads those, never the English.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

ReadMore = str | Callable[[int, int], str]


@dataclasses.dataclass(frozen=True)
class Cut:
    """Where a capped result was cut: ``cut`` bytes from ``offset`` of a ``total``-byte output,
    readable with ``read_file`` at ``path`` (a kept output ``@output/<id>`` or the file read), from
    ``source_offset`` (the offset in that path's bytes)."""

    offset: int
    cut: int
    total: int
    path: str | None = None
    source_offset: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "cut": self.cut, "total": self.total, "path": self.path,
                "readOffset": self.source_offset + self.offset}


def _utf8_head(data: bytes, size: int) -> str:
    return data[:max(0, size)].decode("utf-8", errors="ignore")


def _utf8_tail(data: bytes, size: int) -> str:
    return data[len(data) - max(0, size):].decode("utf-8", errors="ignore") if size > 0 else ""


def cap_with_cut(text: str, limit: int, *, read_more: ReadMore, path: str | None = None,
                 source_offset: int = 0) -> tuple[str, Cut | None]:
    """``text`` if it fits ``limit`` UTF-8 bytes; else head + marker + tail, at most ``limit`` bytes,
    and the :class:`Cut` saying where (None when nothing was cut).

    ``read_more`` (a format string with ``{offset}`` and ``{cut}``, or a function of them) tells the
    model how to read the cut part: ``offset`` is the first byte cut, ``cut`` the bytes cut.
    """
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, None
    marker_room = 0
    head_size = tail_size = cut = 0
    marker = ""
    for _ in range(3):  # the marker's length depends on the numbers it prints
        keep = max(0, limit - marker_room)
        head_size = keep * 3 // 4  # the head usually matters more (what a log or file starts with)
        tail_size = keep - head_size
        cut = len(data) - head_size - tail_size
        marker = (f"\n\n[hopline: {cut} bytes cut from the middle of this {len(data)}-byte result "
                  f"(tool result cap {limit} bytes). "
                  + (read_more(head_size, cut) if callable(read_more)
                     else read_more.format(offset=head_size, cut=cut)) + "]\n\n")
        marker_bytes = len(marker.encode("utf-8"))
        if marker_bytes <= marker_room:
            break
        marker_room = marker_bytes
    if marker_room >= limit:  # a cap smaller than the marker: the head alone
        return _utf8_head(data, limit), Cut(limit, len(data) - limit, len(data), path, source_offset)
    return (_utf8_head(data, head_size) + marker + _utf8_tail(data, tail_size),
            Cut(head_size, cut, len(data), path, source_offset))


def cap_for_model(text: str, limit: int, *, read_more: ReadMore) -> str:
    """The capped text of :func:`cap_with_cut`."""
    return cap_with_cut(text, limit, read_more=read_more)[0]
