"""Shared test fixtures. Servers started here listen on 127.0.0.1 only and are stopped by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hopline.embedded import EmbeddedStack, start_embedded
from hopline.harness.sample_workspace import make_sample_workspace


@pytest.fixture(scope="module")
def daemon() -> Iterator[EmbeddedStack]:
    """A real `hopline serve` (daemon, gateway, scripted model) on 127.0.0.1, stopped afterwards.

    Test folders with their own daemon fixture (tests/daemon) override this one."""
    stack = start_embedded()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample project whose logs make 100-300 KiB tool outputs."""
    return make_sample_workspace(tmp_path_factory.mktemp("workspace"))
