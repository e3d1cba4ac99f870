"""Compile the relay's per-frame path with mypyc into build/compiled/ (see src/hopline/compiled.py).

    python tools/compile_hot_path.py

Why: at 1 KiB frames most of the daemon's CPU is the interpreter running this path, frame by frame
(issue 30's profile); mypyc compiles the same typed source to C, and the daemon then spends about
30 % less CPU per MiB at 1 KiB frames (bench/README.md has the A/B). mypyc is mypy's compiler (a
dev dependency already), so nothing is hand-written in C.

The build runs on a copy of the package, then replaces build/compiled/ whole, its manifest last: a
build cut off leaves the previous one (which the digest then marks stale, if the sources moved).
Without a C compiler or Python's headers, or when mypyc fails (its output is printed), the manifest
says why and hopline runs its source: ``make demo`` works on any machine. CI does not pass on that:
tests/test_compiled.py requires the compiled modules in use when ``CI`` is set.
"""

from __future__ import annotations

import importlib.machinery
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from hopline.compiled import BUILD_DIR, MANIFEST, PACKAGE_ROOT, source_digest  # noqa: E402

# The per-frame path: pipe read and decode, JSON-RPC kinds and the pipe's tap, relay, the bus (its
# events, subscriber queues and commits), the SSE stream, the journals (ids, staging, SQLite's writer
# thread, PostgreSQL's writer task), their row groups, segments and checksums. Left as source: modules
# that define async generators (mypyc has none) and the observer (compiled, it gained nothing).
# Compiled, a variable keeps the type of its first assignment and mypyc checks every later one at run
# time, where mypy lets an ``Any`` through: give each value its own name (pg_journal's fencing answer
# once reused a row's name, and every fenced commit failed with a TypeError).
HOT_MODULES = (
    "hopline/wire/ndjson.py",
    "hopline/wire/jsonrpc.py",
    "hopline/wire/hooks.py",
    "hopline/wire/passthrough.py",
    "hopline/daemon/pipe_chunks.py",
    "hopline/daemon/child.py",
    "hopline/daemon/projection.py",
    "hopline/daemon/sessions/relay.py",
    "hopline/daemon/bus/bus_event.py",
    "hopline/daemon/bus/subscriber.py",
    "hopline/daemon/bus/commits.py",
    "hopline/daemon/bus/ring.py",
    "hopline/daemon/bus/event_bus.py",
    "hopline/daemon/routes/sse.py",
    "hopline/store/event_groups.py",
    "hopline/store/segments.py",
    "hopline/store/integrity.py",
    "hopline/store/journal.py",
    "hopline/store/sqlite_journal.py",
    "hopline/store/sqlite_writer.py",
    "hopline/store/pg_journal.py",
)


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _write_manifest(out: Path, manifest: dict[str, object]) -> None:
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(out / MANIFEST)


def _replace_build(new: Path) -> None:
    old = BUILD_DIR.with_name(BUILD_DIR.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if BUILD_DIR.exists():
        BUILD_DIR.rename(old)
    new.rename(BUILD_DIR)
    shutil.rmtree(old, ignore_errors=True)


def _cannot_build() -> str | None:
    """Why this machine cannot compile an extension module, or None."""
    compiler = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Debian: python3-dev)"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install -e '.[dev]')"
    return None


def build() -> int:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    BUILD_DIR.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="compiled-", dir=BUILD_DIR.parent))
    try:
        out = work / "out"
        out.mkdir()
        digest = source_digest(PACKAGE_ROOT)
        why = _cannot_build()
        if why is None:
            stage = work / "stage"
            skipped = shutil.ignore_patterns("__pycache__", "static")
            shutil.copytree(PACKAGE_ROOT, stage / "hopline", ignore=skipped)
            done = subprocess.run([sys.executable, "-m", "mypyc", *HOT_MODULES], cwd=stage,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
                why = "mypyc failed (the build printed its output)"
        if why is not None:
            print(f"compile_hot_path: {why}: hopline runs its source", file=sys.stderr)
            _write_manifest(out, {"digest": digest, "suffix": suffix, "modules": {}, "why": why})
            _replace_build(out)
            return 0
        modules: dict[str, str] = {}
        for path in HOT_MODULES:
            rel = path.removesuffix(".py") + suffix
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(stage / rel, out / rel)
            modules[_module_name(path)] = rel
        runtime = {}
        for lib in stage.glob(f"*__mypyc{suffix}"):  # mypyc's shared runtime of the group
            shutil.copy2(lib, out / lib.name)
            runtime[lib.name.removesuffix(suffix)] = lib.name
        if source_digest(PACKAGE_ROOT) != digest:
            print("compile_hot_path: the sources changed during the build; run it again", file=sys.stderr)
            return 1
        _write_manifest(out, {"digest": digest, "suffix": suffix, "modules": modules, "runtime": runtime})
        _replace_build(out)
        print(f"compile_hot_path: {len(modules)} modules compiled into {BUILD_DIR.relative_to(REPO)}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(build())
