"""``make soak`` (``python -m bench.soak [--runs 20]``): ``hopline demo`` N times in a row, each run's
time and exit code, then the count that exited 0. The main job must never fail by chance (SPEC T-5):
any run that did not exit 0 makes the soak exit 1, with the tail of that run's stderr.

Not part of ``make test`` (20 runs take several minutes); every change to the daemon, the gate or
the CLI runs it once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

RUN_TIMEOUT_SECONDS = 300  # one demo run takes 12-20 s here; a hang is a failure, not a wait


def run_once() -> tuple[int, float, str]:
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "hopline", "demo"], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_SECONDS, env=os.environ.copy())
        code, tail = done.returncode, done.stderr[-2000:]
    except subprocess.TimeoutExpired:
        code, tail = -1, f"no exit within {RUN_TIMEOUT_SECONDS} s"
    return code, time.monotonic() - started, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    failures: list[tuple[int, int, str]] = []
    times: list[float] = []
    for number in range(1, args.runs + 1):
        code, seconds, tail = run_once()
        times.append(seconds)
        print(f"soak run {number:2d}/{args.runs}: exit {code} in {seconds:5.1f} s", flush=True)
        if code != 0:
            failures.append((number, code, tail))
    passed = args.runs - len(failures)
    print(f"soak: {passed} of {args.runs} runs exited 0; time min {min(times):.1f} s, "
          f"median {sorted(times)[len(times) // 2]:.1f} s, max {max(times):.1f} s")
    for number, code, tail in failures:
        print(f"--- run {number} (exit {code}), the end of its stderr:\n{tail}", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
