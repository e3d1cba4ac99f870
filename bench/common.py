"""Shared helpers of the benchmarks: results, verdicts, machine facts, ports, processes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
PYTHON = sys.executable
MB = 1_000_000  # throughput is reported in decimal MB/s; sizes of frames are 1024-based
HOST = "127.0.0.1"


@dataclasses.dataclass
class Settings:
    quick: bool
    workdir: Path

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of ``values`` (the inclusive method: with few
    rounds the quartiles stay inside the measured range); one value is its own quartiles."""
    if not values:
        raise ValueError("quartiles of no values")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def quiesce() -> None:
    """Call between interleaved runs, outside their CPU windows: ``os.sync()``. The writeback of
    what the run before stored (a journal, the floor relay's file) would otherwise complete inside
    the next run's window, and this machine's kernel (no IRQ time accounting) charges the disk's
    interrupts to whichever process runs (measured: the path after the floor relay spent 6-13 %
    more server CPU at 8 MiB frames; with this, the A/A pair measured the same)."""
    os.sync()


def interleaved(names: Sequence[str], rounds: int) -> Iterator[str]:
    """Every name ``rounds`` times, round i starting at name i (no variant always runs first), each
    after :func:`quiesce` (what the run before stored is written out outside every window)."""
    for i in range(rounds):
        shift = i % len(names)
        for name in [*names[shift:], *names[:shift]]:
            quiesce()
            yield name


def aa_spread(aa_ratios: Sequence[float]) -> float:
    """The noise floor of a measurement, from the per-round ratios of two identical runs (A/A, 1.0
    if nothing moved): how far the A/A's interquartile band reaches from 1, as a relative figure.
    It covers both a bias between the two (the band is off 1) and the scatter (the band is wide)."""
    q1, _, q3 = quartiles(aa_ratios)
    return max(abs(q1 - 1.0), abs(q3 - 1.0))


@dataclasses.dataclass
class Verdict:
    """One target: the measured value, the target and the outcome (``None`` measured: not measured).

    ``spread`` (in the measured value's unit) is the noise floor of the measurement, from an A/A
    run. When it is given, the verdict counts only if the spread is under a third of the margin
    between the measured value and the target; otherwise the status is ``NOISY`` whatever the side
    of the target the value fell on (never ``PASS``)."""

    name: str
    measured: float | None
    target: float
    higher_is_better: bool
    unit: str = "x"
    note: str = ""
    spread: float | None = None

    @property
    def passed(self) -> bool | None:
        if self.measured is None:
            return None
        return self.measured >= self.target if self.higher_is_better else self.measured <= self.target

    @property
    def margin(self) -> float | None:
        """Distance from the measured value to the target, in the measured value's unit."""
        return None if self.measured is None else abs(self.measured - self.target)

    @property
    def status(self) -> str:
        """``PASS``, ``MISS``, ``NOISY`` (the A/A spread is not under a third of the margin) or ``SKIP``."""
        if self.measured is None:
            return "SKIP"
        if self.spread is not None:
            margin = self.margin
            assert margin is not None
            if not self.spread < margin / NOISE_FRACTION_OF_MARGIN:  # also catches a NaN spread
                return "NOISY"
        return "PASS" if self.passed else "MISS"

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        shown = "n/a" if self.measured is None else f"{self.measured:.3g}{self.unit}"
        spread = ""
        if self.spread is not None and self.measured is not None:
            spread = f", A/A spread {self.spread:.3g}{self.unit} vs margin {self.margin:.3g}{self.unit}"
        note = f" ({self.note})" if self.note else ""
        target = f"target {op} {self.target:g}{self.unit}"
        return f"  [{self.status}] {self.name}: {shown} ({target}{spread}){note}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "measured": self.measured, "target": self.target,
                "op": ">=" if self.higher_is_better else "<=", "unit": self.unit,
                "spread": self.spread, "margin": self.margin, "verdict": self.status, "note": self.note}


# A verdict counts only when the A/A spread is under a third of the margin to the target (issue 30).
NOISE_FRACTION_OF_MARGIN = 3.0


@dataclasses.dataclass
class BenchResult:
    name: str
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    verdicts: list[Verdict] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"figures": self.figures, "verdicts": [v.to_json() for v in self.verdicts],
                "notes": self.notes, "skipped": self.skipped, "seconds": round(self.seconds, 2)}


def say(text: str = "") -> None:
    print(text, flush=True)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import psutil

        memory = psutil.virtual_memory()
        info["memoryBytes"] = memory.total
        info["memoryGiB"] = round(memory.total / 2**30, 1)
        # Free memory at the start, the state the run met: this VM hands free pages back to its
        # host (free page reporting) and pages out memory left cold for a minute (DAMON).
        info["freeGiB"] = round(memory.free / 2**30, 1)
        info["loadAvg1m"] = round(os.getloadavg()[0], 2)
    except Exception:  # psutil is a dev dependency; the machine facts are best effort
        pass
    return info


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server process exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {HOST}:{port} after {timeout}s")


def stop_process(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """Stop a process we started (its own process group): SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


@contextlib.contextmanager
def started(args: list[str], *, env: dict[str, str] | None = None, port: int | None = None,
            startup_timeout: float = 30.0,
            stderr_path: Path | None = None) -> Iterator[subprocess.Popen[Any]]:
    """Start ``args`` in its own process group; wait for ``port``; always stop it afterwards."""
    err = open(stderr_path, "wb") if stderr_path is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=err, cwd=REPO_ROOT, start_new_session=True)
    try:
        if port is not None:
            wait_for_port(port, startup_timeout, proc)
        yield proc
    finally:
        stop_process(proc)
        if stderr_path is not None:
            err.close()  # type: ignore[union-attr]


def tail(path: Path, nbytes: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-nbytes:].decode("utf-8", "replace")


def rate(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds if seconds > 0 else float("inf")


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b
