"""The compiled hot path (src/hopline/compiled.py): used only when built from exactly the sources
that run, for this interpreter; otherwise the source runs, and the state says why. In CI the build
must be in use, so the whole suite tests the compiled modules."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hopline import compiled
from hopline.compiled import ENV, MANIFEST, CompiledFinder, load_manifest, source_digest

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
REPO = Path(__file__).resolve().parents[1]


def _package(root: Path) -> Path:
    pkg = root / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "hot.py").write_text("X = 1\n")
    return pkg


def _build(root: Path, pkg: Path, **fields: object) -> Path:
    build = root / "build"
    (build / "pkg" / "sub").mkdir(parents=True)
    (build / "pkg" / "sub" / f"hot{SUFFIX}").write_bytes(b"")
    (build / f"abc__mypyc{SUFFIX}").write_bytes(b"")
    manifest = {"digest": source_digest(pkg), "suffix": SUFFIX,
                "modules": {"pkg.sub.hot": f"pkg/sub/hot{SUFFIX}"},
                "runtime": {"abc__mypyc": f"abc__mypyc{SUFFIX}"}, **fields}
    (build / MANIFEST).write_text(json.dumps(manifest))
    return build


def test_a_build_of_exactly_these_sources_is_on(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    state, files = load_manifest(_build(tmp_path, pkg), pkg)
    assert (state.state, state.modules) == ("on", 1)
    assert files == {"pkg.sub.hot": tmp_path / "build" / "pkg" / "sub" / f"hot{SUFFIX}",
                     "abc__mypyc": tmp_path / "build" / f"abc__mypyc{SUFFIX}"}


@pytest.mark.parametrize("change", ["edit", "add", "remove", "rename"])
def test_any_change_to_any_source_makes_the_build_stale(tmp_path: Path, change: str) -> None:
    pkg = _package(tmp_path)
    build = _build(tmp_path, pkg)
    if change == "edit":
        (pkg / "__init__.py").write_text(" ")  # one byte, in a module that is not compiled
    elif change == "add":
        (pkg / "sub" / "new.py").write_text("")
    elif change == "remove":
        (pkg / "__init__.py").unlink()
    else:
        (pkg / "sub" / "hot.py").rename(pkg / "sub" / "cold.py")
    state, files = load_manifest(build, pkg)
    assert state.state == "stale" and files == {}
    assert "make" in state.reason


def test_bytecode_caches_do_not_count(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    build = _build(tmp_path, pkg)
    (pkg / "sub" / "__pycache__").mkdir()
    (pkg / "sub" / "__pycache__" / "hot.cpython-311.pyc").write_bytes(b"\0")
    assert load_manifest(build, pkg)[0].state == "on"


def test_a_build_for_another_interpreter_or_with_a_module_missing_is_not_used(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    other = _build(tmp_path / "a", pkg, suffix=".cpython-312-x86_64-linux-gnu.so")
    absent = compiled.CompiledState("absent", reason="built for another interpreter")
    assert load_manifest(other, pkg) == (absent, {})
    missing = _build(tmp_path / "b", pkg)
    (missing / f"abc__mypyc{SUFFIX}").unlink()
    assert load_manifest(missing, pkg)[0].reason == "a compiled module is missing"


def test_no_build_and_a_build_that_could_not_compile_say_why(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    assert load_manifest(tmp_path / "nothing", pkg)[0].state == "absent"
    failed = _build(tmp_path, pkg, modules={}, why="no C compiler (cc)")
    assert load_manifest(failed, pkg) == (compiled.CompiledState("absent", reason="no C compiler (cc)"), {})
    (failed / MANIFEST).write_text("{not json")
    assert load_manifest(failed, pkg)[0].reason == "unreadable manifest (JSONDecodeError)"


@pytest.mark.parametrize(("value", "reason"), [("0", f"{ENV}=0"), ("yes", f"{ENV} is 'yes', not 0 or 1")])
def test_the_switch_turns_it_off_and_says_a_value_it_does_not_know(tmp_path: Path, value: str, reason: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path)
    build = _build(tmp_path, pkg)
    finders = list(sys.meta_path)
    monkeypatch.setenv(ENV, value)
    assert compiled.install(build, pkg) == compiled.CompiledState("off", reason=reason)
    assert sys.meta_path == finders


def test_the_finder_answers_for_its_modules_only(tmp_path: Path) -> None:
    so = tmp_path / f"hot{SUFFIX}"
    finder = CompiledFinder({"pkg.sub.hot": so})
    spec = finder.find_spec("pkg.sub.hot")
    assert spec is not None and spec.origin == str(so)
    assert isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
    assert finder.find_spec("pkg.sub.cold") is None


def _hot_modules() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("compile_hot_path", REPO / "tools" / "compile_hot_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(path.removesuffix(".py").replace("/", ".") for path in module.HOT_MODULES)


def test_this_checkout_runs_its_hot_path_compiled() -> None:
    """make builds the hot path before the tests; in CI its modules must be the ones in use."""
    state = compiled.STATE
    if state.state != "on":
        if os.environ.get("CI"):
            pytest.fail(f"the compiled hot path is not in use in CI: {state.state} ({state.reason})")
        pytest.skip(f"the compiled hot path is {state.state} here ({state.reason}); `make compiled` builds")
    hot = _hot_modules()
    assert state.modules == len(hot)
    for name in hot:
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(SUFFIX), name
        assert Path(module.__file__).is_relative_to(compiled.BUILD_DIR), name


def test_with_the_switch_off_the_source_runs() -> None:
    code = ("import hopline.compiled as c, hopline.daemon.sessions.relay as r; "
            "print(c.STATE.state, r.__file__.endswith('.py'))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, ENV: "0"}, capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.split() == ["off", "True"]
