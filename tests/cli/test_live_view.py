"""`hopline run` / `demo` rendering: text shows as it streams; the progress line names the estimate
that was used and any compaction whose model summary failed."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
from typing import Any

from rich.console import Console

from hopline.cli.run import LiveView, compaction_line, progress_line
from hopline.client import Event
from hopline.client.turn import TurnTracker

PIECES = ["Looking ", "at ", "the ", "workspace ", "first."]


def _chunk(event_id: int, text: str) -> Event:
    return Event(event_id, "session_update", {"promptId": "p1", "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}})


def _progress(event_id: int, **extra: Any) -> Event:
    return Event(event_id, "progress", {"promptId": "p1", "progress": {
        "iteration": 2, "maxIterations": 60, "bodyBytes": 4096, "ceilingBytes": 8 * 1024 * 1024,
        "estimateTokens": 41_200, "effectiveWindowTokens": 128_000, "compactions": 0, "trigger": None,
        **extra}})


async def _feed(view: LiveView, tracker: TurnTracker, events: list[Event]) -> None:
    for event in events:
        changed = tracker.apply(event)
        await view.on_event(event, tracker, changed)


async def test_off_a_terminal_each_chunk_is_written_as_it_arrives() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    tracker = TurnTracker("p1")
    with LiveView(console) as view:
        await _feed(view, tracker, [_progress(1), _chunk(2, PIECES[0]), _chunk(3, PIECES[1])])
        assert out.getvalue().endswith("agent: Looking at ")  # before the message is complete
        await _feed(view, tracker, [_chunk(4 + i, p) for i, p in enumerate(PIECES[2:])])
        await _feed(view, tracker, [_progress(10)])
    text = out.getvalue()
    assert text.count("agent: Looking at the workspace first.\n") == 1


async def test_a_retry_after_a_cut_stream_is_said() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=160)
    tracker = TurnTracker("p1")
    retry = {"origin": "model", "status": 502, "hop": "gateway.provider", "attempt": 1, "streamedBytes": 11}
    with LiveView(console) as view:
        await _feed(view, tracker, [_progress(1), _chunk(2, PIECES[0]), _chunk(3, PIECES[1]),
                                    _progress(4, retry=retry), _chunk(5, "Looking again.")])
    text = out.getvalue()
    assert "agent: Looking at \n↻ llm-turn sent again after a failure (origin model, HTTP 502; 11 B of its " \
           "reply had streamed)\nagent: Looking again." in text


async def test_on_a_terminal_the_text_grows_above_the_progress_line() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=160, height=30)
    tracker = TurnTracker("p1")
    with LiveView(console) as view:
        await _feed(view, tracker, [_progress(1, estimateSource="usage"), _chunk(2, PIECES[0]),
                                    _chunk(3, PIECES[1])])
        shown = Console(file=io.StringIO(), width=160)
        shown.print(view._render())
        rendered = shown.file.getvalue()  # type: ignore[attr-defined]
        assert "agent: Looking at" in rendered
        assert "estimate 41.2k / 128.0k tokens (usage)" in rendered
        await _feed(view, tracker, [_progress(4)])  # the message ended: it goes into the log
        again = Console(file=io.StringIO(), width=160)
        again.print(view._render())
        assert "agent:" not in again.file.getvalue()  # type: ignore[attr-defined]


def test_progress_and_compaction_lines_say_when_the_summarizer_fell_back() -> None:
    tracker = TurnTracker("p1")
    tracker.apply(_progress(1, estimateSource="bytes"))
    error = {"origin": "code", "status": 400, "hop": "gateway.provider"}
    record = {"trigger": "transport", "reactive": True, "messagesReplaced": 12, "bytesReplaced": 400_000,
              "bytesBefore": 500_000, "bytesAfter": 90_000, "summarizer": "extractive",
              "summarizerError": error}
    tracker.apply(Event(2, "compaction", {"promptId": "p1", "compaction": record}))
    line = progress_line(tracker)
    assert "tokens (bytes)" in line
    assert "compactions 1 (transport) │ summarizer extractive x1 (origin code HTTP 400)" in line
    assert tracker.summarizer_errors() == [error]
    shown = compaction_line(record, 1)
    assert "(trigger transport, reactive)" in shown
    assert "the model's summary failed: origin code, status 400" in shown


def test_the_fetch_hint_names_the_daemon_it_ran_against_and_never_a_token() -> None:
    from hopline.cli.sidecar import fetch_hint

    sid, ref = "a" * 32, "b" * 32
    assert fetch_hint(sid, ref) == f"hopline sidecar {sid} {ref} > file"
    assert fetch_hint(sid, ref, data_dir="/tmp/x y") == (
        f"hopline sidecar {sid} {ref} --data-dir '/tmp/x y' > file")
    assert fetch_hint(sid, ref, url="http://127.0.0.1:8765") == (
        f"hopline sidecar {sid} {ref} --url http://127.0.0.1:8765 > file")  # the token: $HOPLINE_SERVER_TOKEN
    assert fetch_hint(sid, ref, url="http://me:secret@127.0.0.1:8765", token_from_env=False) == (
        f'hopline sidecar {sid} {ref} --url http://127.0.0.1:8765 --token "$HOPLINE_SERVER_TOKEN" > file')


def test_a_sidecar_id_never_reads_as_an_option_on_the_command_line() -> None:
    from hopline.cli.sidecar import fetch_hint
    from hopline.sidecars.entry import new_sidecar_id

    assert not any(new_sidecar_id().startswith("-") for _ in range(2000))  # 1 in 64 would, unchecked
    sid, old = "a" * 32, "-" + "b" * 31  # an id stored before the rule: the hint ends the options
    hint = fetch_hint(sid, old, url="http://127.0.0.1:9")
    assert hint == f"hopline sidecar --url http://127.0.0.1:9 -- {sid} {old} > file"
    argv = shlex.split(hint.removesuffix(" > file"))[1:]
    fetched = subprocess.run([sys.executable, "-m", "hopline", *argv], capture_output=True, timeout=60,
                             env={**os.environ, "HOPLINE_SERVER_TOKEN": "t"})
    assert fetched.returncode == 1 and b"Usage:" not in fetched.stderr  # parsed; nobody listens on :9


def test_a_gate_refused_as_too_large_shows_the_limit_that_refused_it() -> None:
    """demo --naive: the gateway's 100 KiB refused the bodies; the table says so, not "/ 8 MiB"."""
    from rich.console import Console

    from hopline.cli.gate import body_against_ceiling, summary_table

    naive = {"agent": "appsec", "verdict": "error", "findings": [], "iterations": 4, "compactions": 0,
             "maxBodyBytes": 90 * 1024, "ceilingBytes": 8 * 1024 * 1024, "http413s": 2, "attempt": 2,
             "error": {"origin": "code", "status": 413, "hop": "gateway.llm_turn", "limit": 100 * 1024,
                       "observed": 120 * 1024}}
    assert body_against_ceiling(naive) == "120 KiB / 100 KiB (gateway.llm_turn refused it)"
    within = {**naive, "error": None, "maxBodyBytes": 300 * 1024}
    assert body_against_ceiling(within) == "300 KiB / 8 MiB"
    console = Console(record=True, width=200)
    console.print(summary_table({"agents": [naive], "base": "a" * 40, "finalHead": "b" * 40}))
    assert "100 KiB (gateway.llm_turn refused it)" in console.export_text()
    assert "/ 8 MiB" not in console.export_text()


def test_status_shows_a_short_session_id_in_its_tables() -> None:
    from rich.console import Console

    from hopline.cli.status import print_status

    sid = "0123456789abcdef" * 2
    status = {"sessions": [{"sessionId": sid, "cwd": "/secret/path", "state": "ready", "devState": "idle"}],
              "gates": [{"gateId": "g_" + "1" * 24, "state": "done", "exitCode": 0, "round": 1,
                         "devSessionId": sid, "devState": "idle", "items": {}, "verdicts": {}}]}
    console = Console(record=True, width=200)
    print_status(console, status)
    text = console.export_text()
    assert text.count("01234567…") == 2 and sid not in text and "/secret/path" not in text
