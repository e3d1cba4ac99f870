"""Pipe hooks (SPEC W-3): byte hooks and frame observers, one :class:`PipeTap` per direction.

Byte hooks receive only the frame's size; observers receive a :class:`FrameObservation`
``{direction, bytes, message}``. Both fire only after a message was successfully read (decoded) or
written (the write awaited without raising); a failed write reports nothing. A hook that raises is
swallowed and counted: observation must never break the transport.

Sizes are frame bytes without the ``\\n`` (as :class:`hopline.wire.ndjson.Frame.size`), so the
same message measures the same in both directions.

A reader that decodes many frames per read notifies them at once (:meth:`PipeTap.notify_read_frames`):
the sizes hooks then get one list per read instead of one call per frame: at small frames the
per-frame calls (a tap, two byte hooks) are a visible share of the daemon's CPU per frame, the list
form a fraction of it (SPEC W-3 holds: sizes only, after the frames were decoded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from hopline.wire.ndjson import Frame, FrameError, encode

Direction = Literal["inbound", "outbound"]  # inbound = child -> daemon, outbound = daemon -> child
DIRECTIONS: tuple[Direction, ...] = ("inbound", "outbound")

ByteHook = Callable[[int], None]
# The sizes of several frames, in stream order, with their sum, the smallest and the largest (the
# tap computes them in one pass for every hook and its own large-frame check: each pass over a
# read's sizes is a share of the observer's cost per frame, a target of its own).
SizesHook = Callable[[list[int], int, int, int], None]


@dataclasses.dataclass(frozen=True)
class FrameObservation:
    direction: Direction
    bytes: int
    message: Any = dataclasses.field(repr=False)


Observer = Callable[[FrameObservation], None]


class PipeTap:
    """The hooks of one direction of the pipe."""

    def __init__(self, direction: Direction, *, byte_hooks: list[ByteHook] | None = None,
                 observers: list[Observer] | None = None) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be inbound or outbound, got {direction!r}")
        self.direction: Direction = direction
        self.byte_hooks: list[ByteHook] = list(byte_hooks or [])
        self.observers: list[Observer] = list(observers or [])
        self._observer_min_bytes: list[int] = [0] * len(self.observers)
        self._observe_from = 0 if self.observers else None  # the smallest frame any observer takes
        self.sizes_hooks: list[SizesHook] = []
        self.hook_errors = 0  # hooks that raised (swallowed)
        self.notified = 0

    def add_byte_hook(self, hook: ByteHook) -> None:
        self.byte_hooks.append(hook)

    def add_sizes_hook(self, hook: SizesHook) -> None:
        """``hook`` gets the sizes of several frames at once (one call per read); for a single
        frame, a list of one."""
        self.sizes_hooks.append(hook)

    def add_observer(self, observer: Observer, *, min_bytes: int = 0) -> None:
        """``observer`` hears of frames of at least ``min_bytes`` (the large-frame observer's
        threshold: a smaller frame then costs no observation at all)."""
        self.observers.append(observer)
        self._observer_min_bytes.append(min_bytes)
        self._observe_from = min(self._observer_min_bytes)

    def _notify(self, size: int, message: Any) -> None:
        self.notified += 1
        for hook in self.byte_hooks:
            try:
                hook(size)
            except Exception:
                self.hook_errors += 1
        if self.sizes_hooks:
            self._notify_sizes([size], size, size, size)
        if self._observe_from is None or size < self._observe_from:
            return
        self._observe(size, message)

    def _notify_sizes(self, sizes: list[int], total: int, smallest: int, largest: int) -> None:
        for sizes_hook in self.sizes_hooks:
            try:
                sizes_hook(sizes, total, smallest, largest)
            except Exception:
                self.hook_errors += 1

    def _observe(self, size: int, message: Any) -> None:
        observation = FrameObservation(self.direction, size, message)
        for observer, min_bytes in zip(self.observers, self._observer_min_bytes, strict=True):
            if size < min_bytes:
                continue
            try:
                observer(observation)
            except Exception:
                self.hook_errors += 1

    def notify_read(self, size: int, message: Any) -> None:
        """A message of ``size`` frame bytes was successfully read and decoded."""
        self._notify(size, message)

    def notify_read_frames(self, items: list[Frame | FrameError], *, errors: bool = True) -> None:
        """The frames of one read were decoded (the errors among ``items`` are skipped): what
        :meth:`notify_read` does for each, with one call of each sizes hook for all of them.
        ``errors=False`` tells that ``items`` holds frames only (the decoder counted no error in
        this read): their sizes are then taken without a per-item type check."""
        if self.byte_hooks:  # the per-frame hooks keep their per-frame calls, in stream order
            for item in items:
                if item.__class__ is Frame:
                    self._notify(item.size, item.message)
            return
        # One pass for the sizes, their sum and extremes (compiled, a typed loop costs less than
        # building the list and three builtin passes over it).
        sizes: list[int] = []
        total = largest = 0
        smallest = -1
        for item in items:
            if errors and item.__class__ is not Frame:
                continue
            size = item.size
            sizes.append(size)
            total += size
            if size > largest:
                largest = size
            if size < smallest or smallest < 0:
                smallest = size
        if not sizes:
            return
        self.notified += len(sizes)
        if self.sizes_hooks:
            self._notify_sizes(sizes, total, smallest, largest)
        observe_from = self._observe_from
        if observe_from is None or largest < observe_from:
            return
        for item in items:
            if item.__class__ is Frame and item.size >= observe_from:
                self._observe(item.size, item.message)

    async def write_observed(self, write: Callable[[bytes], Awaitable[None]], message: Any) -> int:
        """Encode ``message``, await ``write(line)``, then notify; return the frame size.

        If ``write`` raises, the exception propagates and no hook hears of the message.
        """
        line = encode(message)
        await write(line)
        size = len(line) - 1  # without the newline, as on the read side
        self._notify(size, message)
        return size

    def write_observed_sync(self, write: Callable[[bytes], object], message: Any) -> int:
        """As :meth:`write_observed` for a synchronous ``write``."""
        line = encode(message)
        write(line)
        size = len(line) - 1
        self._notify(size, message)
        return size


async def write_observed(tap: PipeTap, write: Callable[[bytes], Awaitable[None]], message: Any) -> int:
    """Module-level form of :meth:`PipeTap.write_observed`."""
    return await tap.write_observed(write, message)
