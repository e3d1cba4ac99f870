"""CPU seconds spent by the processes of one relay path during one measured window (issue 30).

Wall-clock throughput on a shared machine moves by 2x between runs; the CPU time a path spends
per MiB relayed does not depend on who else runs. A window snapshots psutil's process times
(user + system) of a relay's server process and of its children alive at the start (the agent;
children started during the window, such as a warm-pool refill, are not this relay's work and are
left out), and this process's own CPU time (the client).

psutil's process times come in clock ticks (10 ms): a run of 0.1 s of CPU would be read to +-10 %.
So the time of a process is read from the scheduler, in nanoseconds: the sum over its threads of
``/proc/PID/task/TID/schedstat`` (time on a CPU, user and system), psutil's times only where that
file is missing. A thread that ends inside the window takes its time with it; the daemon's threads
(event loop, journal writer) live as long as the daemon.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from typing import Any

import psutil


def _schedstat_seconds(pid: int) -> float | None:
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/schedstat", "rb") as f:
                total += int(f.read().split(None, 1)[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return total / 1e9


def _cpu(proc: psutil.Process) -> float | None:
    """CPU seconds of ``proc`` so far (all its threads), None when it is gone."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        seconds = _schedstat_seconds(proc.pid)
        if seconds is not None:
            return seconds
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return float(times.user + times.system)


@dataclasses.dataclass
class CpuSample:
    """CPU seconds of one window: the relay's server process, its agent(s), the client (us)."""

    server: float
    agent: float
    client: float

    @property
    def total(self) -> float:
        return self.server + self.agent + self.client

    def to_json(self) -> dict[str, float]:
        return {"server": self.server, "agent": self.agent, "client": self.client, "total": self.total}


class CpuWindow:
    """``start()`` then ``stop()`` around the measured part of one run of a relay path."""

    def __init__(self, server_pid: int | None) -> None:
        self._server = psutil.Process(server_pid) if server_pid is not None else None
        self._start: dict[int, tuple[psutil.Process, float]] = {}
        self._client_start = 0.0
        self.sample: CpuSample | None = None
        self.started = False

    def start(self) -> None:
        self._start = {}
        if self._server is not None:
            procs = [self._server, *self._server.children(recursive=True)]
            for proc in procs:
                value = _cpu(proc)
                if value is not None:
                    self._start[proc.pid] = (proc, value)
        self._client_start = time.process_time()
        self.started = True

    def stop(self) -> CpuSample:
        client = time.process_time() - self._client_start
        server = agent = 0.0
        for pid, (proc, before) in self._start.items():
            after = _cpu(proc)
            if after is None:
                continue  # gone before the end: its time cannot be read (the agents outlive the window)
            if self._server is not None and pid == self._server.pid:
                server = after - before
            else:
                agent += after - before
        self.sample = CpuSample(server=server, agent=agent, client=client)
        return self.sample


def children_cpu_seconds() -> float:
    """CPU seconds of this process's reaped children (for ``cat``, measured once it is waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def per_mib(sample: CpuSample | dict[str, Any], nbytes: int) -> dict[str, float]:
    """Each field of ``sample`` in CPU milliseconds per MiB of frames relayed."""
    values = sample.to_json() if isinstance(sample, CpuSample) else sample
    mib = nbytes / (1024 * 1024)
    return {k: v * 1e3 / mib for k, v in values.items()}
