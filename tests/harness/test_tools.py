from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.harness.sandbox import Limits, sandbox_environment
from hopline.harness.tools import (
    TOOL_NAMES,
    ToolError,
    Workspace,
    cap_for_model,
    check_review_command,
    tool_environment,
    tool_schemas,
)

LIMIT = 32 * 1024


def test_cap_exactly_at_limit_passes_uncut_and_one_byte_over_is_cut() -> None:
    exact = "a" * LIMIT
    assert cap_for_model(exact, LIMIT, read_more="x") == exact
    over = "a" * LIMIT + "b"
    capped = cap_for_model(over, LIMIT, read_more="read_file offset={offset} limit={cut}")
    assert capped != over
    assert len(capped.encode()) <= LIMIT
    assert capped.startswith("a" * 1000) and capped.endswith("b")
    marker = re.search(r"\[hopline: (\d+) bytes cut .*?offset=(\d+) limit=(\d+)\]", capped)
    assert marker is not None
    cut, offset, limit = (int(g) for g in marker.groups())
    kept = LIMIT + 1 - cut
    assert cut == limit and offset + cut + (kept - offset) == LIMIT + 1
    assert capped[:offset] == over[:offset]


def test_cap_never_splits_utf8() -> None:
    text = "é" * LIMIT
    capped = cap_for_model(text, LIMIT, read_more="")
    assert len(capped.encode("utf-8")) <= LIMIT
    capped.encode("utf-8").decode("utf-8")


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.log").write_text("x" * 100 + "\nERROR here\n")
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    os.symlink(outside, root / "link.txt")
    os.symlink(tmp_path, root / "linkdir")
    return Workspace(root, Budget.defaults(), allow_write=True)


@pytest.mark.parametrize("path", ["../secret.txt", "sub/../../secret.txt", "/etc/passwd", "link.txt",
                                  "linkdir/secret.txt", "~/x"])
async def test_path_escapes_refused(ws: Workspace, path: str) -> None:
    for name, args in (("read_file", {"path": path}), ("write_file", {"path": path, "content": "x"}),
                       ("list_files", {"path": path})):
        outcome = await ws.run(name, args, "c1")
        assert outcome.status == "failed", (name, path)
        assert "refused" in outcome.output
    assert (ws.root.parent / "secret.txt").read_text() == "secret"


async def test_read_file_offset_limit_and_read_more(tmp_path: Path) -> None:
    budget = Budget.defaults().replace(tool_result_max_bytes=1000)
    ws = Workspace(tmp_path, budget)
    data = "".join(f"{i:05d}\n" for i in range(1000))  # 6000 bytes
    (tmp_path / "big.txt").write_text(data)
    outcome = await ws.run("read_file", {"path": "big.txt"}, "c")
    assert outcome.output == data
    assert len(outcome.model_output.encode()) <= 1000
    m = re.search(r"offset=(\d+) limit=(\d+)", outcome.model_output)
    assert m is not None
    offset, limit = int(m[1]), int(m[2])
    more = await ws.run("read_file", {"path": "big.txt", "offset": offset, "limit": limit}, "c2")
    assert more.output.split("\n[file continues")[0] == data[offset:offset + limit]
    part = await ws.run("read_file", {"path": "big.txt", "offset": 6, "limit": 12}, "c3")
    assert part.output.startswith("00001\n00002\n") and "file continues" in part.output


async def test_list_search_write(ws: Workspace) -> None:
    listing = await ws.run("list_files", {"path": "."}, "c")
    assert "a.txt" in listing.output and "sub/b.log" in listing.output
    found = await ws.run("search_workspace", {"query": "ERROR"}, "c")
    assert "sub/b.log:2: ERROR here" in found.output
    wrote = await ws.run("write_file", {"path": "new/dir/f.txt", "content": "héllo"}, "c")
    assert wrote.status == "completed" and (ws.root / "new/dir/f.txt").read_text() == "héllo"
    read_only = Workspace(ws.root, ws.budget)
    refused = await read_only.run("write_file", {"path": "x.txt", "content": "x"}, "c")
    assert refused.status == "failed" and not (ws.root / "x.txt").exists()


async def test_search_bounded_by_budget(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("match\n" * 50)
    (tmp_path / "huge.txt").write_text("match\n" * 100)
    budget = Budget.defaults().replace(search_max_matches=10, search_max_file_bytes=400)
    out = (await Workspace(tmp_path, budget).run("search_workspace", {"query": "match"}, "c")).output
    assert out.count("match") - out.count("matches") == 10
    assert "stopped at 10 matches" in out


@pytest.mark.e2e
async def test_run_command_output_and_capture_limit(tmp_path: Path) -> None:
    budget = Budget.defaults().replace(command_output_max_bytes=1000, tool_result_max_bytes=300)
    ws = Workspace(tmp_path, budget)
    command = "printf 'x%.0s' $(seq 1 5000); echo; echo err >&2"
    outcome = await ws.run("run_command", {"command": command}, "c9")
    assert outcome.output.startswith("x" * 1000)
    assert "more bytes of output not captured" in outcome.output
    assert len(outcome.model_output.encode()) <= 300
    # the cut part can be read back
    m = re.search(r"read_file path='(@output/[^']+)' offset=(\d+) limit=(\d+)", outcome.model_output)
    assert m is not None
    back = await ws.run("read_file", {"path": m[1], "offset": int(m[2]), "limit": int(m[3])}, "c10")
    expected = outcome.output.encode()[int(m[2]):int(m[2]) + int(m[3])].decode()
    assert back.output.split("\n[file continues")[0] == expected
    ws.close()


@pytest.mark.e2e
async def test_run_command_timeout_kills(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, Budget.defaults().replace(command_timeout_seconds=0.2))
    outcome = await ws.run("run_command", {"command": "echo started; sleep 5; echo never"}, "c")
    assert outcome.status == "failed"
    assert "started" in outcome.output and "never" not in outcome.output
    assert "timeout of 0.2 s" in outcome.output


def test_schemas_are_openai_functions() -> None:
    schemas = tool_schemas(TOOL_NAMES)
    assert [s["function"]["name"] for s in schemas] == list(TOOL_NAMES)
    assert all(s["type"] == "function" and s["function"]["parameters"]["type"] == "object" for s in schemas)


async def test_read_file_result_at_the_cap_and_one_byte_over(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, Budget.defaults())
    (tmp_path / "exact.txt").write_text("e" * LIMIT)
    (tmp_path / "over.txt").write_text("o" * (LIMIT + 1))
    exact = await ws.run("read_file", {"path": "exact.txt"}, "c1")
    assert exact.model_output == exact.output == "e" * LIMIT
    over = await ws.run("read_file", {"path": "over.txt"}, "c2")
    assert over.output == "o" * (LIMIT + 1)
    assert over.model_output != over.output and len(over.model_output.encode()) <= LIMIT
    m = re.search(r"\[hopline: (\d+) bytes cut .*read_file path='over.txt' offset=(\d+) limit=(\d+)",
                  over.model_output)
    assert m is not None and int(m[1]) == int(m[3]) > 0


# --- the review command policy (a gate session's run_command) --------------------------------------


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "tests").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "pkg").mkdir()
    os.symlink(tmp_path, root / "out")
    return root


@pytest.mark.parametrize("command", [
    "pytest -q", "python -m pytest tests/test_app.py", "ruff check src", "mypy src", "make test",
    "ruff format --check .", "go vet ./...", "pytest -x -q --tb=short -k 'app and not slow' tests",
    "pytest tests/test_app.py::test_one[1] --maxfail 2 -rA", "python3 -m unittest -v tests.test_app",
    "python -m unittest discover -s tests -p 'test_*.py'", "ruff check --select E,F --output-format json src",
    "mypy --strict -p pkg", "go test -run TestApp -count=1 ./pkg/...", "cargo test --workspace app_tests",
    "make lint -j4 -k", "npm run lint", "black --check --diff src", "pylint --disable=C0114 src",
    "flake8 --max-line-length 100 src", "go test ."])
def test_a_gate_session_runs_tests_and_linters(command: str, checkout: Path) -> None:
    argv = check_review_command(command, checkout)
    assert argv[0] == command.split()[0]


@pytest.mark.parametrize("command", [
    # not a test runner or linter, or shell syntax
    "rm -rf src", "cat src/app.py", "pytest; rm -rf src", "pytest && echo x", "pytest > out.txt", "black src",
    "pytest $(whoami)", "python -c 'print(1)'", "git commit -am x", "PYTEST_ADDOPTS=-x pytest",
    # options that write files, fix code, load plugins or run another program (#19's audit)
    "ruff check --fix src", "ruff check --fix=true .", "pytest --basetemp=/home", "pytest --basetemp /home",
    "ruff check --output-file=/any", "pytest --junitxml=/any", "pytest -o cache_dir=/any",
    "mypy --cache-dir=/any",
    "pytest -p evil_plugin", "pytest -pevil_plugin", "make test PYTEST=rm", "go test -exec=/bin/sh ./...",
    "go test -exec /bin/sh ./...", "go test -toolexec=/bin/sh ./...", "go test -o /tmp/x ./...",
    "pytest --rootdir=/", "pytest -c /etc/pytest.ini", "mypy --install-types", "mypy --junit-xml=/any src",
    "pylint --load-plugins=evil src", "pylint --output-format=json:/tmp/x src",
    "cargo test --target-dir /tmp/x",
    "cargo test -- --logfile /tmp/x", "make test -f /tmp/Makefile", "make test install", "make -C / test",
    "npm test -- --x", "pytest --quiet=1", "pytest -qx",
    # operands outside the checkout
    "pytest /etc", "pytest ../x", "pytest ~/x", "pytest out/x", "ruff check /", "go test ../...",
    "go test example.com/pkg", "python -m unittest discover -s /", "pytest --maxfail lots",
])
def test_anything_else_is_refused_to_a_gate_session(command: str, checkout: Path) -> None:
    with pytest.raises(ToolError, match="tests and linters only"):
        check_review_command(command, checkout)


def test_a_refusal_names_the_option_and_what_the_command_takes(checkout: Path) -> None:
    with pytest.raises(ToolError) as refused:
        check_review_command("pytest --basetemp=/home", checkout)
    assert "option --basetemp is not one pytest takes" in str(refused.value)
    assert "--maxfail" in str(refused.value)
    with pytest.raises(ToolError, match=r"PYTEST=\.\.\.: variable assignments are refused"):
        check_review_command("make test PYTEST=rm", checkout)


def test_a_tool_gets_none_of_hopline_s_settings_or_credentials() -> None:
    environ = {"PATH": "/bin", "LANG": "C.UTF-8", "HOPLINE_DATA_DIR": "/data", "HOPLINE_SIDECAR_DIR": "/sc",
               "HOPLINE_NAIVE": "1", "HOPLINE_SERVER_TOKEN": "t", "OPENAI_API_KEY": "k",
               "API_JSON_BODY_LIMIT": "100kb", "MY_TOOL_SETTING": "x"}
    assert tool_environment(environ) == {"PATH": "/bin", "LANG": "C.UTF-8", "MY_TOOL_SETTING": "x"}


@pytest.mark.parametrize("kind", ["bwrap", "unshare"])
def test_a_review_command_keeps_only_the_locale_and_absolute_search_paths(tmp_path: Path, kind: str) -> None:
    environ = {"PATH": f"/usr/bin{os.pathsep}.{os.pathsep}{os.pathsep}bin", "LC_ALL": "C", "HOME": "/root",
               "MAKEFLAGS": "-e", "PYTEST_ADDOPTS": "-p evil", "GOFLAGS": "-exec=/bin/sh",
               "HOPLINE_DATA_DIR": "/data"}
    limits = Limits.of(Budget.defaults())
    env = sandbox_environment(environ, kind, tmp_path / "private", tmp_path, limits)  # type: ignore[arg-type]
    assert env["PATH"] == "/usr/bin:/usr/local/bin:/bin" and env["LC_ALL"] == "C"  # then the system's own
    assert env["HOME"] == "/tmp/home" and env["TMPDIR"] == "/tmp"  # the sandbox's private tmpfs
    assert all(env[k].startswith("/tmp/home/") for k in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                                                         "XDG_DATA_HOME"))
    assert env["PYTEST_ADDOPTS"] == "-p no:cacheprovider"
    assert not {"MAKEFLAGS", "GOFLAGS", "HOPLINE_DATA_DIR"} & set(env)
    # both backends are told their mounts on their command line: the command sees none of hopline's names
    assert not [k for k in env if k.startswith("HOPLINE_")]
    unsandboxed = sandbox_environment(environ, "none", tmp_path, tmp_path, Limits.of(Budget.defaults()))
    assert unsandboxed["HOME"] == str(tmp_path / "home") and unsandboxed["TMPDIR"] == str(tmp_path)
    assert all(Path(unsandboxed[k]).is_dir() for k in ("HOME", "TMPDIR", "XDG_CACHE_HOME"))
