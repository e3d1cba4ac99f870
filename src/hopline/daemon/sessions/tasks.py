"""Fire-and-forget work the daemon starts on the event loop, kept referenced until it ends and
cancelled at shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def spawn(self, awaitable: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
