"""Warm agent children (SPEC D-9): started and initialized before any session asks for one.

``POST /session`` then pays only for ``session/new``. One pool per agent command, of
``budget.warm_children`` children (``HOPLINE_WARM_CHILDREN``; 0 turns the pool off). A child is taken
out of the pool by exactly one session and never comes back: children are never shared. Each take
refills the pool in the background; a warm child that exits is dropped and replaced. A warm child
gets nothing per session in its environment (credentials travel in ``session/new``).

A start that fails is logged (the exception type only) and not retried until the next take, and a
pool whose warm children keep exiting replaces at most ``size`` of them between two takes: a broken
agent command cannot spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from hopline.daemon.child import AcpChild

log = logging.getLogger("hopline.daemon.pool")

# Starts one child and initializes it: (child, its initialize result).
StartChild = Callable[[], Awaitable[tuple[AcpChild, dict[str, Any]]]]


class WarmPool:
    def __init__(self, size: int, start: StartChild) -> None:
        self.size = size
        self._start = start
        self._ready: list[tuple[AcpChild, dict[str, Any]]] = []
        self._starting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.started = 0  # children this pool started
        self.taken = 0
        self.replaced = 0  # warm children that exited and were replaced
        self.failures = 0
        self._replaced_since_take = 0

    def take(self) -> tuple[AcpChild, dict[str, Any]] | None:
        """A live warm child, out of the pool for good; ``None`` when none is ready. Refills."""
        child: tuple[AcpChild, dict[str, Any]] | None = None
        while self._ready and child is None:
            candidate = self._ready.pop(0)
            if candidate[0].alive:
                child = candidate
        if child is not None:
            self.taken += 1
        self._replaced_since_take = 0
        self.fill()
        return child

    def fill(self) -> None:
        """Start children in the background until the pool holds ``size`` (ready or starting)."""
        if self._closed:
            return
        for _ in range(self.size - len(self._ready) - self._starting):
            self._starting += 1
            task = asyncio.ensure_future(self._start_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _start_one(self) -> None:
        try:
            child, init = await self._start()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failures += 1
            log.warning("warm child failed to start", extra={"error": type(exc).__name__})
            return
        finally:
            self._starting -= 1
        self.started += 1
        if self._closed or not child.alive:
            await child.stop()
            return
        self._ready.append((child, init))

    def exited(self, child: AcpChild) -> None:
        """A warm child exited before any session took it: drop it and start another."""
        before = len(self._ready)
        self._ready = [(c, i) for c, i in self._ready if c is not child]
        if len(self._ready) < before:
            log.info("warm child exited", extra={"exitCode": child.returncode})
            if self._replaced_since_take < self.size:
                self._replaced_since_take += 1
                self.replaced += 1
                self.fill()

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        ready, self._ready = self._ready, []
        await asyncio.gather(*(child.stop() for child, _ in ready), return_exceptions=True)

    def status(self) -> dict[str, Any]:
        return {"size": self.size, "ready": len(self._ready), "starting": self._starting,
                "pids": [child.pid for child, _ in self._ready], "started": self.started,
                "taken": self.taken, "replaced": self.replaced, "failures": self.failures}
