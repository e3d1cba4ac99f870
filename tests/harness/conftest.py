from __future__ import annotations

from pathlib import Path

import pytest

from hopline.scripted.sample_workspace import make_sample_workspace


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A sample workspace whose logs are 100 KiB (tool results hit the 32 KiB cap)."""
    return make_sample_workspace(tmp_path / "ws", file_bytes=100 * 1024)
