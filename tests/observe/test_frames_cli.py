"""`hopline frames` on a generated capture, as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from hopline.budget import Budget
from hopline.wire.ndjson import encode

pytestmark = pytest.mark.e2e  # every test here starts real processes

THRESHOLD = Budget.defaults().large_frame_threshold_bytes

NO_DROPS = {"dropped": 0, "droppedBytes": 0, "maxDroppedBytes": 0}


def _capture(path: Path) -> None:
    big_update = {"sessionUpdate": "tool_call_update", "toolCallId": "c", "kind": "execute",
                  "rawOutput": "o" * THRESHOLD, "content": [{"type": "content",
                                                             "content": {"type": "text", "text": "t" * 10}}]}
    lines = [
        encode({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 1}}),
        encode({"jsonrpc": "2.0", "method": "session/update",
                "params": {"sessionId": "secret-session", "update": big_update}}),
        b"not json at all\n",
        encode({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": "m" * 2000}}}}),
        b'{"jsonrpc":"2.0","id":2,"result":{',  # EOF inside a frame
    ]
    path.write_bytes(b"".join(lines))


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "hopline", "frames", *args], capture_output=True,
                          timeout=timeout, check=False)


def test_frames_prints_records_and_a_summary(tmp_path: Path) -> None:
    capture = tmp_path / "inbound.ndjson"
    _capture(capture)
    done = _run(str(capture))
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    *records, summary = lines
    assert len(records) == 1
    record = records[0]
    assert record["sourceClass"] == "session_update_notification"
    assert record["direction"] == "inbound" and record["bytes"] >= THRESHOLD
    assert record["maxRawOutputTextBytes"] == THRESHOLD and record["toolName"] == "execute"
    assert b"secret-session" not in done.stdout
    assert summary["errors"] == {"frameTooLarge": 0, "invalidFrame": 1, "incompleteFrame": 1}
    assert summary["stats"]["inbound"]["count"] == 3
    assert summary["stats"]["inbound"]["maxBytes"] == record["bytes"]
    assert summary["stats"]["outbound"] == {"count": 0, "totalBytes": 0, "maxBytes": 0, **NO_DROPS}
    assert summary["stats"]["inbound"]["dropped"] == 2  # the invalid frame and the incomplete one
    assert summary["largeFrames"] == {"logged": 1, "suppressed": 0, "thresholdBytes": THRESHOLD}
    assert b"invalid_json" in done.stderr and b"not json" not in done.stderr


def test_frames_threshold_and_direction_and_stdin(tmp_path: Path) -> None:
    capture = tmp_path / "outbound.ndjson"
    _capture(capture)
    with capture.open("rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "hopline", "frames", "-", "--direction", "outbound",
                               "--threshold", "1KiB"], stdin=stdin, capture_output=True, timeout=60,
                              check=False)
    assert done.returncode == 0, done.stderr
    *records, summary = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [r["sourceClass"] for r in records] == ["session_update_notification"] * 2
    assert all(r["direction"] == "outbound" and r["thresholdBytes"] == 1024 for r in records)
    assert summary["stats"]["outbound"]["count"] == 3


def test_frames_oversized_frame_counted_with_env_max_frame(tmp_path: Path) -> None:
    capture = tmp_path / "c.ndjson"
    capture.write_bytes(encode({"id": 1, "result": {"x": "y" * 5000}}) + encode({"id": 2, "result": {}}))
    import os

    env = {**os.environ, "HOPLINE_PIPE_MAX_FRAME_BYTES": "4kb", "HOPLINE_AGENT_MAX_FRAME_BYTES": "4kb"}
    done = subprocess.run([sys.executable, "-m", "hopline", "frames", str(capture)], capture_output=True,
                          timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    summary = orjson.loads(done.stdout.splitlines()[-1])
    assert summary["errors"]["frameTooLarge"] == 1 and summary["stats"]["inbound"]["count"] == 1
    assert b"4096" in done.stderr


def test_frames_bad_options_exit_2(tmp_path: Path) -> None:
    assert _run("--direction", "sideways").returncode == 2
    assert _run("--threshold", "lots").returncode == 2
    assert _run(str(tmp_path / "missing.ndjson")).returncode == 2
