"""Runs an ACP peer on stdio and records both directions (``acp_tape.py TAPE -- CMD...``): each
message as one line ``{"dir": "c2a" | "a2c", "msg": ...}`` (client to agent, agent to client), for the
SDK's zod schemas to check afterwards. The bytes pass through unchanged. ``{pid}`` in TAPE names one
tape per connection (a daemon starts several children: the session's, the warm pool's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import IO


def pump(source: IO[bytes], sink: IO[bytes], direction: str, tape: IO[str], lock: threading.Lock) -> None:
    """Whole lines only, each taped before it is passed on: an answer is never taped before its
    request."""
    buffer = b""
    while chunk := source.read1(65536):  # type: ignore[attr-defined]
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        if not lines:
            continue
        with lock:
            for line in lines:
                if line.strip():
                    tape.write(json.dumps({"dir": direction, "msg": json.loads(line)}) + "\n")
            tape.flush()
        sink.write(b"".join(line + b"\n" for line in lines))
        sink.flush()
    if buffer:
        sink.write(buffer)
    sink.close()


def main() -> int:
    tape_path, argv = sys.argv[1].replace("{pid}", str(os.getpid())), sys.argv[3:]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    lock = threading.Lock()
    with open(tape_path, "a") as tape:
        inbound = threading.Thread(target=pump, args=(sys.stdin.buffer, child.stdin, "c2a", tape, lock),
                                   daemon=True)
        inbound.start()
        pump(child.stdout, sys.stdout.buffer, "a2c", tape, lock)
        return child.wait()


if __name__ == "__main__":
    sys.exit(main())
