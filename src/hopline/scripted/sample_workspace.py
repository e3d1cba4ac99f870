"""A generated sample project whose tools produce large outputs (for the demo, simulate, tests).

Deterministic for a given seed: a few small source files and large test logs and reports, so a
gate agent's ``read_file`` / ``run_command cat`` results are 100-300 KiB before the per-result cap.
"""

from __future__ import annotations

import random
from pathlib import Path

DEFAULT_FILE_BYTES = 160 * 1024

_MODULES = ("core", "api", "storage", "util")
_WORDS = ("request", "session", "budget", "window", "token", "frame", "payload", "retry", "cursor",
          "buffer", "ceiling", "summary", "gateway", "pipe", "stream")


def _source(name: str, rng: random.Random) -> str:
    lines = [f'"""The {name} module of the sample service."""', "", "from __future__ import annotations", ""]
    for i in range(rng.randint(8, 14)):
        word = rng.choice(_WORDS)
        lines += [f"def {word}_{name}_{i}(value: int) -> int:",
                  f"    # TODO: check the {word} bound before use",
                  f"    return value * {rng.randint(2, 9)} + {i}", ""]
    return "\n".join(lines)


# The sample's tests are the standard library's unittest, so that they run wherever Python does (a
# plain install of hopline has no pytest); its modules live under src/, put on the path here.
TESTS_INIT = ('"""The sample\'s tests import it from src/."""\n\nimport sys\nfrom pathlib import Path\n\n'
              'sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))\n')


def _test(name: str) -> str:
    return (f"import unittest\n\nfrom sample import {name}\n\n\n"
            f"class {name.title()}Test(unittest.TestCase):\n"
            f"    def test_{name}_has_functions(self) -> None:\n"
            f"        public = [v for k, v in vars({name}).items() if not k.startswith('_')]\n"
            "        self.assertTrue(any(callable(v) for v in public))\n")


def _log(index: int, size: int, rng: random.Random, failure_rate: float = 0.04) -> str:
    out: list[str] = []
    used = 0
    n = 0
    while used < size:
        n += 1
        word = rng.choice(_WORDS)
        level = "ERROR" if rng.random() < failure_rate else ("WARN" if rng.random() < 0.1 else "INFO")
        outcome = "FAILED" if level == "ERROR" else "PASSED"
        line = (f"2026-08-19T10:{n // 60 % 60:02d}:{n % 60:02d}Z {level} run={index} "
                f"tests/test_{rng.choice(_MODULES)}.py::test_{word}_{n} {outcome} "
                f"elapsed={rng.randint(1, 900)}ms {word}={rng.randint(0, 10**6)}")
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)[:size]


def make_sample_workspace(root: Path, *, file_bytes: int = DEFAULT_FILE_BYTES, seed: int = 0,
                          logs: int = 4) -> Path:
    """Write the sample project under ``root`` (created if needed) and return ``root``."""
    rng = random.Random(seed)
    root = Path(root)
    (root / "src" / "sample").mkdir(parents=True, exist_ok=True)
    (root / "tests").mkdir(exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    (root / "reports").mkdir(exist_ok=True)
    (root / "README.md").write_text("# sample service\n\nA generated project for hopline's tool loop.\n")
    (root / "tests" / "__init__.py").write_text(TESTS_INIT)
    for name in _MODULES:
        (root / "src" / "sample" / f"{name}.py").write_text(_source(name, rng))
        (root / "tests" / f"test_{name}.py").write_text(_test(name))
    for index in range(1, logs + 1):
        (root / "logs" / f"test-run-{index}.log").write_text(_log(index, file_bytes, rng))
    (root / "reports" / "coverage.txt").write_text(_log(0, file_bytes, rng))
    return root


def write_test_logs(directory: Path, *, count: int, file_bytes: int = DEFAULT_FILE_BYTES, seed: int = 0,
                    failure_rate: float = 0.04) -> list[Path]:
    """``count`` test logs ``test-run-N.log`` of ``file_bytes`` each under ``directory``; a failing
    test is an ``ERROR ... FAILED`` line, at ``failure_rate`` (0: every test passes)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(1, count + 1):
        path = directory / f"test-run-{index}.log"
        path.write_text(_log(index, file_bytes, rng, failure_rate))
        paths.append(path)
    return paths
