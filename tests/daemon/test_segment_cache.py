"""The journal's segment files keep only their newest pages in the page cache (src/hopline/store/
segments.py, ``CACHE_STEP_BYTES``): each time a file grows by a step, the kernel is asked to drop its
written-out pages up to the step before; a sync drops every whole page. What is dropped still reads
back whole and checked. Residency is read with mincore(2) on a real file in the test's directory."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import pytest

from hopline.store.integrity import checksum
from hopline.store.segments import CACHE_STEP_BYTES, SegmentWriter, read_rows, segment_path

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def resident_pages(path: Path) -> list[bool]:
    """Which of the file's pages are in the page cache (mapping it faults nothing in)."""
    size = path.stat().st_size
    pages = -(-size // PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(pages)
            assert _libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return [bool(byte & 1) for byte in vector.raw[:pages]]
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


@pytest.fixture
def dropping_fs(tmp_path: Path) -> Path:
    """tmp_path, when its filesystem drops clean pages on request (tmpfs keeps them: then skip)."""
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"p" * 16 * PAGE)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 16 * PAGE, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if any(resident_pages(probe)):
        pytest.skip("this filesystem keeps clean pages cached on POSIX_FADV_DONTNEED (tmpfs)")
    probe.unlink()
    return tmp_path


def _clean(path: Path) -> None:
    """Write the file's dirty pages out without dropping them (another descriptor's fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_pages_are_dropped_when_the_file_grows_by_a_step_not_a_byte_before(dropping_fs: Path) -> None:
    writer = SegmentWriter(dropping_fs)
    try:
        writer.append("s1", [b"a" * (CACHE_STEP_BYTES - PAGE)])
        writer.append("s1", [b"b" * (PAGE - 1)])  # the file is one byte short of a step
        path = segment_path(dropping_fs, "s1")
        _clean(path)
        assert all(resident_pages(path))  # clean, and nothing asked the kernel to drop them

        writer.append("s1", [b"c"])  # the step: every page before the end's may go now
        resident = resident_pages(path)
        assert len(resident) == CACHE_STEP_BYTES // PAGE
        assert not any(resident[:-1])  # the last page was dirtied by this append: it may stay
    finally:
        writer.close()


def test_a_sync_drops_every_whole_page_and_the_events_read_back_whole(dropping_fs: Path) -> None:
    datas = [bytes([97 + i % 26]) * (CACHE_STEP_BYTES // 3 + 1000 * i + 7) for i in range(8)]
    writer = SegmentWriter(dropping_fs)
    try:
        offset = 0
        for data in datas:
            assert writer.append("s1", [data]) == offset
            offset += len(data)
        writer.sync()
        resident = resident_pages(segment_path(dropping_fs, "s1"))
        assert offset % PAGE  # a partial last page, which the next append fills: it may stay
        assert not any(resident[:-1])
    finally:
        writer.close()

    rows, at = [], 0
    for seq, data in enumerate(datas, start=1):
        rows.append((seq, "session_update", b"", at, len(data), checksum(data)))
        at += len(data)
    page = read_rows(dropping_fs, "s1", rows, lambda seq, kind, data, corrupt: (data, corrupt))
    assert [data for data, _ in page] == datas
    assert [corrupt for _, corrupt in page] == [None] * len(datas)
