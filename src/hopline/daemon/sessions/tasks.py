"""Fire-and-forget work the daemon starts on the event loop, kept referenced until it ends and
cancelled at shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger("hopline.daemon.sessions")


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def spawn(self, awaitable: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Any]) -> None:
        """Every background task's end is retrieved: a failure is logged (by kind), never left as a
        "Task exception was never retrieved"."""
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", extra={"error": type(task.exception()).__name__})

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
