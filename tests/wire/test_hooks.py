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


def test_read_frames_gives_sizes_hooks_one_list_and_observers_only_large_frames() -> None:
    batches: list[list[int]] = []
    seen: list[FrameObservation] = []
    tap = PipeTap("inbound")
    tap.add_sizes_hook(lambda sizes, total, smallest, largest: batches.append(sizes)
                       if (total, smallest, largest) == (sum(sizes), min(sizes), max(sizes)) else None)
    tap.add_observer(seen.append, min_bytes=30)
    big = {"id": 2, "result": {"text": "y" * 40}}
    items = NdjsonDecoder(1024).feed(encode({"id": 1, "result": {}}) + b'{"bad"\n' + encode(big))
    assert len(items) == 3  # two frames and the invalid line between them
    tap.notify_read_frames(items)
    small_size, big_size = len(encode({"id": 1, "result": {}})) - 1, len(encode(big)) - 1
    assert batches == [[small_size, big_size]]  # the error is skipped, one call for the read
    assert seen == [FrameObservation("inbound", big_size, big)]
    assert tap.notified == 2
    tap.notify_read_frames(items[1:2])  # only an error: nothing is notified
    assert batches == [[small_size, big_size]] and tap.notified == 2


def test_read_frames_keeps_per_frame_calls_for_byte_hooks_and_swallows_raising_sizes_hooks() -> None:
    sizes: list[int] = []

    def bad_sizes(_: list[int], total: int, smallest: int, largest: int) -> None:
        raise RuntimeError("boom")

    tap = PipeTap("inbound", byte_hooks=[sizes.append])
    tap.add_sizes_hook(bad_sizes)
    items = NdjsonDecoder(1024).feed(b'{"a":1}\n{"a":22}\n')
    tap.notify_read_frames(items)
    assert sizes == [7, 8]
    assert tap.hook_errors == 2  # the sizes hook raised once per frame, the stream went on


def test_read_frames_without_errors_takes_the_sizes_as_they_are() -> None:
    batches: list[list[int]] = []
    tap = PipeTap("inbound")
    tap.add_sizes_hook(lambda sizes, total, smallest, largest: batches.append(sizes)
                       if (total, smallest, largest) == (sum(sizes), min(sizes), max(sizes)) else None)
    decoder = NdjsonDecoder(1024)
    before = decoder.frame_errors
    items = decoder.feed(b'{"a":1}\n{"a":22}\n')
    assert decoder.frame_errors == before  # what daemon/child.py checks before errors=False
    tap.notify_read_frames(items, errors=False)
    assert batches == [[7, 8]] and tap.notified == 2
    decoder.feed(b'{"bad"\n' + b"x" * 2000 + b"\n")
    assert decoder.frame_errors == before + 2
