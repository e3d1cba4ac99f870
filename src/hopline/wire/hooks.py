"""Pipe hooks (SPEC W-3): byte hooks and frame observers, one :class:`PipeTap` per direction.

Byte hooks receive only the frame's size; observers receive a :class:`FrameObservation`
``{direction, bytes, message}``. Both fire only after a message was successfully read (decoded) or
written (the write awaited without raising); a failed write reports nothing. A hook that raises is
swallowed and counted: observation must never break the transport.

Sizes are frame bytes without the ``\\n`` (as :class:`hopline.wire.ndjson.Frame.size`), so the
same message measures the same in both directions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from hopline.wire.ndjson import encode

Direction = Literal["inbound", "outbound"]  # inbound = child -> daemon, outbound = daemon -> child
DIRECTIONS: tuple[Direction, ...] = ("inbound", "outbound")

ByteHook = Callable[[int], None]


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
        self.hook_errors = 0  # hooks that raised (swallowed)
        self.notified = 0

    def add_byte_hook(self, hook: ByteHook) -> None:
        self.byte_hooks.append(hook)

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
        if self._observe_from is None or size < self._observe_from:
            return
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
