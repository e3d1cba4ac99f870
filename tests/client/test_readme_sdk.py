"""The README's SDK example, as a reader copies it: the first ``python`` block under its SDK heading,
run as it is, against a real `hopline serve`, with only what `serve` told them in the environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from daemon.support import running_daemon

pytestmark = pytest.mark.e2e  # starts a daemon, its agent and the example

README = Path(__file__).resolve().parents[2] / "README.md"


def sdk_example() -> str:
    text = README.read_text()
    heading = text.index("\n## The Python SDK\n")
    match = re.compile(r"^```python\n(.*?)^```$", re.S | re.M).search(text, heading)
    assert match is not None, "no python block under the SDK heading"
    return match.group(1)


def test_the_readme_sdk_example_runs_as_written_prints_the_reply_and_ends(tmp_path: Path,
                                                                         workspace: Path) -> None:
    program = tmp_path / "my_client.py"
    program.write_text(sdk_example())
    with running_daemon(tmp_path, token="", agent_cmd=None) as daemon:  # `hopline serve` as a person runs it
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOPLINE_")}
        env.update({"HOPLINE_URL": daemon.url, "HOPLINE_SERVER_TOKEN": daemon.token})
        ran = subprocess.run([sys.executable, str(program)], cwd=workspace, env=env, capture_output=True,
                             text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "[allowing Run " in ran.stdout  # the default `ask`: a permission request, answered
        assert re.search(r"Done after \d+ tool iterations", ran.stdout)  # the agent's reply, printed
        assert ran.stdout.rstrip().endswith("[turn_complete: end_turn]")
        sessions = httpx.get(daemon.url + "/session", headers=daemon.headers, timeout=10).json()
        assert sessions["sessions"] == []  # the example deletes its session
