"""Pipe hooks (SPEC W-3): after success only, raising hooks swallowed, failed writes silent."""

from __future__ import annotations

import pytest

from hopline.wire.hooks import FrameObservation, PipeTap, write_observed
from hopline.wire.ndjson import NdjsonDecoder, encode


def test_read_notifies_byte_hooks_and_observers() -> None:
    sizes: list[int] = []
    seen: list[FrameObservation] = []
    tap = PipeTap("inbound", byte_hooks=[sizes.append], observers=[seen.append])
    decoder = NdjsonDecoder(1024)
    for frame in decoder.feed(encode({"id": 1, "result": {}}) + b'{"bad"\n'):
        if hasattr(frame, "message"):
            tap.notify_read(frame.size, frame.message)
    assert sizes == [len(b'{"id":1,"result":{}}')]
    assert seen == [FrameObservation("inbound", sizes[0], {"id": 1, "result": {}})]
    assert seen[0].message == {"id": 1, "result": {}}


def test_raising_hooks_never_break_the_stream() -> None:
    def bad_bytes(_: int) -> None:
        raise RuntimeError("boom")

    def bad_observer(_: FrameObservation) -> None:
        raise ValueError("boom")

    sizes: list[int] = []
    tap = PipeTap("inbound", byte_hooks=[bad_bytes, sizes.append], observers=[bad_observer])
    tap.notify_read(10, {"a": 1})
    tap.notify_read(20, {"a": 2})
    assert sizes == [10, 20]  # hooks after the raising one still run
    assert tap.hook_errors == 4


async def test_write_observed_fires_after_successful_write() -> None:
    order: list[str] = []
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        order.append("write")
        written.append(data)

    tap = PipeTap("outbound", byte_hooks=[lambda n: order.append(f"bytes:{n}")],
                  observers=[lambda o: order.append(f"obs:{o.direction}:{o.bytes}")])
    size = await write_observed(tap, write, {"method": "m"})
    assert written == [b'{"method":"m"}\n']
    assert size == len(b'{"method":"m"}')
    assert order == ["write", f"bytes:{size}", f"obs:outbound:{size}"]


async def test_failed_write_reports_nothing() -> None:
    calls: list[object] = []

    async def write(data: bytes) -> None:
        raise BrokenPipeError("child gone")

    tap = PipeTap("outbound", byte_hooks=[calls.append], observers=[calls.append])
    with pytest.raises(BrokenPipeError):
        await tap.write_observed(write, {"method": "m"})
    with pytest.raises(BrokenPipeError):
        tap.write_observed_sync(lambda data: (_ for _ in ()).throw(BrokenPipeError()), {"m": 1})
    assert calls == [] and tap.notified == 0


def test_direction_is_checked() -> None:
    with pytest.raises(ValueError):
        PipeTap("sideways")  # type: ignore[arg-type]


def test_an_observer_with_a_minimum_hears_of_frames_from_that_size_on() -> None:
    seen: list[int] = []
    every: list[int] = []
    tap = PipeTap("inbound")
    tap.add_observer(lambda o: seen.append(o.bytes), min_bytes=100)
    tap.notify_read(99, {})  # one byte under: no observation is built
    tap.notify_read(100, {})  # at the minimum
    tap.add_observer(lambda o: every.append(o.bytes))
    tap.notify_read(5, {})
    assert seen == [100] and every == [5] and tap.notified == 3
