"""`hopline run` and `hopline status` as a user runs them, against a real daemon."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hopline.embedded import EmbeddedStack

from .conftest import HOPLINE, run_cli, run_in_pty

pytestmark = pytest.mark.e2e  # every test here starts real processes

SCRIPT = '{"iterations": 3, "toolsPerIteration": 2}'
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def test_run_json_starts_the_embedded_stack_and_ends_with_the_final(workspace: Path, tmp_path: Path) -> None:
    # TMPDIR: the stack's data dir, kept when the turn moved a field to a sidecar, lands in tmp_path
    result = run_cli(["run", "review the test logs", "--json", "--scripted", SCRIPT, "--profile",
                      "qa_automation"], cwd=workspace, env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    final = lines[-1]
    assert final["type"] == "final" and final["stopReason"] == "end_turn"
    assert final["text"].startswith("Done after 3 tool iterations")
    events = lines[:-1]
    ids = [e["id"] for e in events if e["id"] is not None]
    assert ids == sorted(set(ids))
    assert events[-1]["type"] == "turn_complete"
    assert {"session_update", "progress", "turn_complete"} <= {e["type"] for e in events}
    # The final reply streamed (scripted provider -> gateway -> agent -> daemon SSE): more than one
    # agent_message_chunk, in order, whose concatenation is the reply; its updates are contiguous.
    kinds = [e["data"]["update"]["sessionUpdate"] if e["type"] == "session_update" else e["type"]
             for e in events]
    assert kinds[-2:] == ["plan", "turn_complete"]  # the answer's plan entry, then the end
    start = len(kinds) - 2
    while kinds[start - 1] == "agent_message_chunk":
        start -= 1
    last_run = [e["data"]["update"]["content"]["text"] for e in events[start:-2]]
    assert len(last_run) > 1
    assert "".join(last_run) == final["text"]
    plans = [e["data"]["update"]["entries"] for e in events
             if e["type"] == "session_update" and e["data"]["update"]["sessionUpdate"] == "plan"]
    assert plans[0][-1]["status"] == "in_progress" and plans[-1][-1]["status"] == "completed"


def test_run_in_a_terminal_shows_progress_and_the_final_answer(daemon: EmbeddedStack,
                                                               workspace: Path) -> None:
    code, output = run_in_pty(["run", "review the test logs", "--url", daemon.url, "--scripted", SCRIPT,
                               "--keep"], cwd=workspace, env={"HOPLINE_SERVER_TOKEN": daemon.token})
    text = ANSI.sub("", output)
    assert code == 0, text[-3000:]
    assert re.search(r"iteration \d+/60 │ estimate [\d.]+k? / 128\.0k tokens \((usage|bytes)\) "
                     r"│ compactions 0", text)
    assert re.search(r"largest body [\d.]+ KiB / 8 MiB ceiling", text)
    assert "✓ Read " in text or "✓ Run " in text
    # Outputs that went to a sidecar are shown with their path, size, hash prefix and how to fetch
    # them whole; then a preview of their head and tail.
    moved = re.search(r"content\[0\]\.content\.text: [\d.]+ KiB in sidecar ([0-9a-f]{12}) — "
                      r"(hopline sidecar ([0-9a-f]{32}) ([A-Za-z0-9_-]{32}) --url (\S+)) > file", text)
    assert moved, text[-3000:]
    sha_prefix, command, session_id, _, url = moved.groups()
    assert url == daemon.url and daemon.token not in text
    # the printed command, as printed, with the token in the environment as the run had it
    environ = {k: v for k, v in os.environ.items() if k != "HOPLINE_URL"}
    fetched = subprocess.run([*HOPLINE, *shlex.split(command)[1:]],
                             env={**environ, "HOPLINE_SERVER_TOKEN": daemon.token}, capture_output=True,
                             timeout=60)
    assert fetched.returncode == 0, fetched.stderr
    assert hashlib.sha256(fetched.stdout).hexdigest().startswith(sha_prefix)
    assert len(fetched.stdout) > 64 * 1024
    wrong = subprocess.run([*HOPLINE, "sidecar", session_id, "x" * 32, "--url", daemon.url],
                           env={**os.environ, "HOPLINE_SERVER_TOKEN": daemon.token}, capture_output=True,
                           timeout=60)
    assert wrong.returncode == 1 and b"404" in wrong.stderr and wrong.stdout == b""
    assert re.search(r"sidecars \d+ \([\d.]+ KiB off the wire\)", text)
    assert "final answer · end_turn" in text
    assert "Done after 3 tool iterations" in text


def test_run_on_the_embedded_stack_keeps_its_sidecars_for_hopline_sidecar(workspace: Path) -> None:
    """Without --url the stack stops with the run; its data dir stays when a field went to a sidecar,
    and the printed command fetches it from there."""
    code, output = run_in_pty(["run", "review the test logs", "--scripted", SCRIPT], cwd=workspace)
    text = ANSI.sub("", output)
    assert code == 0, text[-3000:]
    moved = re.search(r"in sidecar ([0-9a-f]{12}) — hopline sidecar ([0-9a-f]{32}) ([A-Za-z0-9_-]{32}) "
                      r"--data-dir (\S+) > file", text)
    assert moved, text[-3000:]
    sha_prefix, session_id, sidecar_id, data_dir = moved.groups()
    kept = Path(data_dir)
    assert f"sidecars kept in {data_dir}" in " ".join(text.split())
    try:
        fetched = subprocess.run([*HOPLINE, "sidecar", session_id, sidecar_id, "--data-dir", data_dir],
                                 capture_output=True, timeout=60)
        assert fetched.returncode == 0, fetched.stderr
        assert hashlib.sha256(fetched.stdout).hexdigest().startswith(sha_prefix)
        other = subprocess.run([*HOPLINE, "sidecar", "0" * 32, sidecar_id, "--data-dir", data_dir],
                               capture_output=True, timeout=60)
        assert other.returncode == 1 and other.stdout == b""  # only the owning session reads it
    finally:
        import shutil

        shutil.rmtree(kept.parent, ignore_errors=True)  # the stack's temporary root


def test_run_off_a_terminal_prints_the_final_text_once(daemon: EmbeddedStack, workspace: Path) -> None:
    result = run_cli(["run", "review the test logs", "--url", daemon.url, "--scripted", SCRIPT],
                     cwd=workspace, env={"HOPLINE_SERVER_TOKEN": daemon.token})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("Done after 3 tool iterations") == 1
    assert "final answer · end_turn (above)" in result.stdout


def test_status_of_an_unreachable_url_says_nothing_answers_there() -> None:
    import socket

    with socket.socket() as sock:  # a port bound but never listened on: nothing answers
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        result = run_cli(["status", "--url", url], env={"HOPLINE_SERVER_TOKEN": "t"})
    assert result.returncode == 1
    assert f"nothing answers at {url}" in result.stderr
    assert "-> 0" not in result.stderr and "ConnectError" not in result.stderr


def test_version() -> None:
    from hopline import __version__

    result = run_cli(["--version"])
    assert (result.returncode, result.stdout.strip()) == (0, f"hopline {__version__}")


def test_a_bad_gate_agent_is_refused_before_any_stack_starts(tmp_path: Path) -> None:
    result = run_cli(["gate", "--agent", "apsec", "--repo", str(tmp_path)])
    assert result.returncode == 2
    assert "apsec" in result.stderr and "appsec" in result.stderr  # names the bad one and the choices
    assert "starting" not in result.stdout + result.stderr and "422" not in result.stderr


def test_serve_on_a_busy_port_says_so_before_printing_a_token(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "HOPLINE_SERVER_TOKEN"}
        result = subprocess.run([*HOPLINE, "serve", "--port", str(port), "--data-dir", str(tmp_path / "d")],
                                env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"cannot bind 127.0.0.1:{port}" in result.stderr
    assert "HOPLINE_SERVER_TOKEN=" not in result.stdout


def test_run_without_a_token_is_refused_with_the_hop(daemon: EmbeddedStack, workspace: Path) -> None:
    result = run_cli(["run", "hi", "--url", daemon.url, "--token", "wrong"], cwd=workspace)
    assert result.returncode == 2
    assert "daemon.api" in result.stderr and "401" in result.stderr


def test_status_json_and_tables(daemon: EmbeddedStack) -> None:
    env = {"HOPLINE_SERVER_TOKEN": daemon.token}
    result = run_cli(["status", "--url", daemon.url, "--json"], env=env)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert set(status["runtime"]["perf"]["pipe"]) == {"inbound", "outbound"}
    tables = run_cli(["status", "--url", daemon.url], env=env)
    assert tables.returncode == 0, tables.stderr
    for title in ("ACP pipe", "inbound", "outbound", "largeFrames.logged", "budget (hopline limits)",
                  "API_JSON_BODY_LIMIT", "10485760 (10 MiB)", "maxDroppedBytes", "delivery.lostBytes",
                  "warmChildren.ready"):
        assert title in tables.stdout
    refused = run_cli(["status", "--url", daemon.url, "--token", "wrong"])
    assert refused.returncode == 1 and "401" in refused.stderr


async def test_drive_turn_sees_only_its_own_turn(daemon: EmbeddedStack, workspace: Path) -> None:
    from hopline.budget import Budget
    from hopline.cli.run import drive_turn
    from hopline.client import DaemonClient

    seen: list[str | None] = []

    async def record(event, tracker, changed) -> None:  # type: ignore[no-untyped-def]
        if not event.synthetic:
            seen.append(event.prompt_id)

    async with DaemonClient(daemon.url, daemon.token, budget=Budget.defaults()) as client:
        session_id = await client.create_session(cwd=str(workspace), scripted={"iterations": 1})
        first = await drive_turn(client, session_id, "first", on_event=record)
        seen.clear()
        second = await drive_turn(client, session_id, "second", on_event=record)
        await client.delete_session(session_id)
    assert first.stop_reason == second.stop_reason == "end_turn"
    assert seen and set(seen) == {second.prompt_id}
    assert second.prompt_id != first.prompt_id


def test_failed_turn_exits_1_naming_origin_hop_and_sizes(workspace: Path, tmp_path: Path) -> None:
    # An engine ceiling one scripted iteration cannot fit (8 tool results of up to 32 KiB each):
    # compaction cannot help, so the body is never sent and the turn fails with origin code.
    env = {"HOPLINE_TRANSPORT_MAX_BODY_BYTES": "160kb", "HOPLINE_SUMMARY_CHUNK_BYTES": "64kb",
           "COLUMNS": "400", "TMPDIR": str(tmp_path)}  # a kept data dir lands in tmp_path
    result = run_cli(["run", "review the logs", "--scripted", '{"iterations": 3, "toolsPerIteration": 8}'],
                     cwd=workspace, env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    match = re.search(r"turn failed: origin code, hop engine\.llm_turn, body (\d+) bytes, limit (\d+) bytes",
                      result.stdout)
    assert match, result.stdout[-2000:]
    assert int(match.group(2)) == 160 * 1024 < int(match.group(1))


def test_run_ask_puts_each_permission_to_the_terminal(daemon: EmbeddedStack, workspace: Path) -> None:
    code, output = run_in_pty(["run", "run the tests", "--url", daemon.url, "--ask", "--scripted",
                               '{"iterations": 3, "toolsPerIteration": 2}'],
                              cwd=workspace, env={"HOPLINE_SERVER_TOKEN": daemon.token},
                              answer=("permission for", b"reject_once\r"))
    text = ANSI.sub("", output)
    assert code == 0, text[-3000:]
    assert re.search(r"permission for Run [^(]+\(allow_once=Allow once, reject_once=Reject\)", text)
    assert re.search(r"✗ Run [^\n]+\[failed\]", text)  # the rejected command did not run
    assert "final answer · end_turn" in text


def test_run_attach_sends_a_resource_link_and_an_image_is_refused_by_an_agent_without_images(
        workspace: Path) -> None:
    """`--attach FILE`: a resource_link the agent reads (echoed back as the user's block); an image
    file becomes an image block, which hopline's agent does not take: the daemon's 422 names it."""
    (workspace / "calc.py").write_text("ATTACHED-LINE 4411\n")
    result = run_cli(["run", "look at", "--json", "--attach", str(workspace / "calc.py"), "--scripted",
                      '{"iterations": 1, "toolsPerIteration": 1}'], cwd=workspace)
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines()][:-1]
    echoed = [e["data"]["update"]["content"] for e in events if e["type"] == "session_update"
              and e["data"]["update"]["sessionUpdate"] == "user_message_chunk"]
    assert echoed[0] == {"type": "text", "text": "look at"}
    assert echoed[1]["type"] == "resource_link" and echoed[1]["name"] == "calc.py"
    assert echoed[1]["uri"] == (workspace / "calc.py").as_uri() and echoed[1]["size"] == 19
    (workspace / "shot.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    refused = run_cli(["run", "see", "--json", "--attach", str(workspace / "shot.png")], cwd=workspace)
    assert refused.returncode != 0
    assert "422: prompt block 1 is image" in refused.stderr and "promptCapabilities.image" in refused.stderr
