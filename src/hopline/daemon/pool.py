"""Warm agent children (SPEC D-9): started and initialized before any session asks for one.

``POST /session`` then pays only for ``session/new``. One pool per agent command, of
``budget.warm_children`` children (``HOPLINE_WARM_CHILDREN``; 0 turns the pool off). A child is taken
out of the pool by exactly one session and never comes back: children are never shared. Each take
refills the pool in the background at once, up to ``size`` children starting at the same time; a
create that finds none ready while some are starting waits for the first of them (bounded: the
handshake deadline), which is never later than a cold start begun then would be. So creates back to
back are all served warm while the pool keeps up (``misses`` counts the creates it could not serve).
A warm child that exits is dropped and replaced. A warm child gets nothing per session in its
environment (credentials travel in ``session/new``).

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
        self.misses = 0  # takes that found no child ready or starting in time (a cold start followed)
        self._replaced_since_take = 0
        self._changed = asyncio.Condition()  # a child became ready, or a start ended

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

    async def take_waiting(self, timeout: float) -> tuple[AcpChild, dict[str, Any]] | None:
        """:meth:`take`, or when none is ready while some are starting, the first that gets ready
        within ``timeout`` seconds; ``None`` (a miss) when none does."""
        taken = self.take()
        if taken is not None or self._closed:
            if taken is None:
                self.misses += 1
            return taken

        def ready_or_none_starting() -> bool:
            return bool(self._ready) or self._starting == 0 or self._closed

        try:
            async with asyncio.timeout(timeout), self._changed:
                while taken is None:
                    await self._changed.wait_for(ready_or_none_starting)
                    taken = self.take()
                    if taken is None and (self._starting == 0 or self._closed):
                        break
        except TimeoutError:
            taken = None
        if taken is None:
            self.misses += 1
        return taken

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

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
            self._starting -= 1
            await self._notify()
            return
        except BaseException:
            self._starting -= 1
            raise
        self._starting -= 1
        self.started += 1
        if self._closed or not child.alive:
            await child.stop()
            await self._notify()
            return
        self._ready.append((child, init))
        await self._notify()

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
                "taken": self.taken, "misses": self.misses, "replaced": self.replaced,
                "failures": self.failures}
