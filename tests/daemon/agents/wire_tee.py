"""Runs an agent command with its stdin copied, byte for byte, to a file: every message the daemon
sends the agent (``wire_tee.py LOG -- CMD...``). The agent's stdout and stderr are its own."""

from __future__ import annotations

import subprocess
import sys


def main() -> int:
    log_path, rest = sys.argv[1], sys.argv[2:]
    argv = rest[1:] if rest and rest[0] == "--" else rest
    child = subprocess.Popen(argv, stdin=subprocess.PIPE)
    assert child.stdin is not None
    with open(log_path, "ab") as log:
        while True:
            chunk = sys.stdin.buffer.read1(65536)
            if not chunk:
                break
            log.write(chunk)
            log.flush()
            try:
                child.stdin.write(chunk)
                child.stdin.flush()
            except BrokenPipeError:
                break
    child.stdin.close()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
