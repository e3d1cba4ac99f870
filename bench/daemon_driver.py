"""Driving ``hopline serve`` for the benchmarks (filled in when the daemon lands)."""

from __future__ import annotations

from pathlib import Path

from bench.common import Settings


def available() -> str | None:
    """None when the daemon can be benchmarked, else why not."""
    try:
        import hopline.daemon.app  # noqa: F401
    except ImportError:
        return "hopline.daemon.app is not there yet"
    return None


def measure_relay(path: Path, frames: int, settings: Settings, *, frame_bytes: int) -> float | None:
    return None


def observer_switch() -> str | None:
    """None when the daemon can run with the observer off; else a note saying what is missing."""
    return ("daemon relay with the observer on/off not measured: the daemon has no switch for it "
            "(measured in process instead)")
