"""`hopline run "<prompt>"`: one prompt, streamed live from a daemon (SPEC C-2).

Without ``--url`` it starts the embedded stack (``hopline serve`` on loopback with a fresh token).
Tool permissions are auto-approved by default (the session is created with
``permissionMode: "auto"``); ``--ask`` asks on the terminal for every permission request instead.
``--json`` prints every event as one JSON line and ends with
``{"type": "final", "text": ..., "stopReason": ...}``. A failed turn exits 1 and names its origin,
hop and sizes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import typer

from hopline.budget import SERVER_TOKEN_ENV, URL_ENV
from hopline.cli._common import budget_or_exit, daemon_target, run_client

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from hopline.budget import Budget
    from hopline.client import DaemonClient, Event, SidecarRef
    from hopline.client.turn import ToolCallView, TurnTracker

EventHook = Callable[["Event", "TurnTracker", "ToolCallView | None"], Awaitable[None]]


def _size(n: int) -> str:
    from hopline.budget import format_size

    return format_size(int(n))


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def summarizer_note(errors: list[dict[str, Any]]) -> str:
    """The compactions whose model summary failed, and why: ``summarizer extractive x2 (origin code
    HTTP 400)`` (the progress line, the gate and demo summaries)."""
    causes = sorted({f"origin {e.get('origin')}" + (f" HTTP {e['status']}" if e.get("status") else "")
                     for e in errors})
    return f"summarizer extractive x{len(errors)} ({', '.join(causes)})"


def progress_line(tracker: TurnTracker) -> str:
    """The live progress line: iteration, estimate vs window (and which estimate: the provider's
    usage or bytes), compactions (and any that fell back to the extractive summary), body vs
    ceiling, sidecars."""
    p = tracker.progress
    parts = [f"iteration {p.get('iteration', tracker.iterations)}/{p.get('maxIterations', '?')}"]
    if p:
        source = f" ({p['estimateSource']})" if p.get("estimateSource") else ""
        parts.append(f"estimate {_tokens(int(p.get('estimateTokens') or 0))} / "
                     f"{_tokens(int(p.get('effectiveWindowTokens') or 0))} tokens{source}")
    triggers = sorted({str(c.get("trigger")) for c in tracker.compactions})
    shown = f" ({', '.join(triggers)})" if triggers else ""
    parts.append(f"compactions {len(tracker.compactions)}{shown}")
    failed = tracker.summarizer_errors()
    if failed:
        parts.append(summarizer_note(failed))
    if tracker.ceiling_bytes:
        parts.append(f"largest body {_size(tracker.max_body_bytes)} / {_size(tracker.ceiling_bytes)} ceiling")
    parts.append(f"tools {len(tracker.tool_calls)}")
    refs = tracker.sidecar_refs()
    if refs:
        parts.append(f"sidecars {len(refs)} ({_size(sum(r.bytes for r in refs))} off the wire)")
    return " │ ".join(parts)


FetchHint = Callable[[str], str]  # sidecar id -> the command line that fetches it


def sidecar_line(ref: SidecarRef, fetch: FetchHint | None = None) -> str:
    """One moved field: its path and size, and how to fetch the whole of it (or what was lost)."""
    items = f", {ref.items_shown} of {ref.items} items shown" if ref.items is not None else ""
    if ref.truncated:
        return (f"{ref.field}: {_size(ref.bytes)}, truncated ({ref.reason}): "
                f"{_size(ref.lost_bytes)} lost{items}")
    line = f"{ref.field}: {_size(ref.bytes)} in sidecar {str(ref.sha256)[:12]}{items}"
    if fetch is not None and ref.id is not None:
        line += f" — {fetch(ref.id)}"
    return line


def tool_line(view: ToolCallView, fetch: FetchHint | None = None) -> str:
    mark = {"completed": "✓", "failed": "✗", "in_progress": "…", "pending": "·"}.get(view.status, "·")
    line = f"{mark} {view.title or view.call_id} [{view.status}]"
    for ref in view.sidecars:
        line += f"\n    ↳ {sidecar_line(ref, fetch)}"
    if view.preview:
        line += f"\n    {view.preview}"
    return line


def compaction_line(record: dict[str, Any], number: int) -> str:
    trigger = str(record.get("trigger")) + (", reactive" if record.get("reactive") else "")
    line = (f"⟲ compaction {number} (trigger {trigger}): replaced "
            f"{record.get('messagesReplaced')} messages / {_size(int(record.get('bytesReplaced') or 0))}, "
            f"body {_size(int(record.get('bytesBefore') or 0))} → {_size(int(record.get('bytesAfter') or 0))}"
            f", summarizer {record.get('summarizer')}")
    error = record.get("summarizerError")
    if isinstance(error, dict):
        line += f" (the model's summary failed: origin {error.get('origin')}, status {error.get('status')})"
    return line


def retry_line(retry: dict[str, Any]) -> str:
    """Why the llm-turn is sent again (a reply cut mid-stream is shown again whole after this)."""
    status = f", HTTP {retry['status']}" if retry.get("status") else ""
    streamed = int(retry.get("streamedBytes") or 0)
    cut = f"; {_size(streamed)} of its reply had streamed" if streamed else ""
    return f"↻ llm-turn sent again after a failure (origin {retry.get('origin')}{status}{cut})"


class LiveView:
    """Rich rendering of a turn: a scrolling log of tool calls and compactions above a live
    progress line. The agent's text shows as it streams: on a terminal it grows in the live area
    above the progress line and goes into the log when the message ends; elsewhere (a pipe) each
    chunk is written as it arrives."""

    def __init__(self, console: Console, *,
                 tool_filter: Callable[[ToolCallView], bool] | None = None,
                 fetch: FetchHint | None = None) -> None:
        from rich.live import Live

        self.console = console
        self.tool_filter = tool_filter  # which finished tool calls get a log line (default: all)
        self.fetch = fetch  # how a moved field is fetched whole (hopline sidecar ...)
        self.extra = ""  # appended to the progress line (the demo shows the daemon's frame stats)
        self._pending_text: list[str] = []
        self._tracker: TurnTracker | None = None
        self.live = Live(self._render(), console=console, auto_refresh=False, transient=False)

    def _render(self) -> RenderableType:
        from rich.text import Text

        if self._tracker is None:
            return Text("starting…", style="dim")
        line = progress_line(self._tracker)
        progress = Text(f"{line} │ {self.extra}" if self.extra else line, style="bold cyan")
        streaming = "".join(self._pending_text).strip()
        if not streaming or not self.console.is_terminal:
            return progress
        from rich.console import Group

        # The tail that fits the screen above the progress line (a display bound only).
        rows = max(1, self.console.size.height - 3)
        tail = "\n".join(streaming.splitlines()[-rows:])
        return Group(Text.assemble(("agent", "green"), ": ", tail), progress)

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush_text()
        self.live.refresh()
        self.live.stop()
        if not self.console.is_terminal:
            self.console.line()  # the last render ends without a newline off a terminal

    def flush_text(self) -> None:
        text = "".join(self._pending_text).strip()
        self._pending_text.clear()
        if not text:
            return
        if self.console.is_terminal:
            self.console.print(f"[green]agent[/]: {_escape(text)}", highlight=False)
        else:  # the chunks were written as they came: end the line
            self.console.file.write("\n")
            self.console.file.flush()

    def _stream_chunk(self, chunk: str) -> None:
        if self.console.is_terminal:
            self.live.update(self._render(), refresh=True)
            return
        started = bool("".join(self._pending_text[:-1]).strip())
        shown = chunk if started else chunk.lstrip()
        if not shown:
            return
        self.console.file.write(shown if started else f"agent: {shown}")
        self.console.file.flush()

    async def on_event(self, event: Event, tracker: TurnTracker, changed: ToolCallView | None) -> None:
        from hopline.vocabulary import COMPACTION, PROGRESS

        self._tracker = tracker
        moved = event.sidecars() if event.update_kind not in (None, "tool_call", "tool_call_update") else []
        if event.update_kind == "agent_message_chunk":
            self._pending_text.append(event.message_text())
            self._stream_chunk(self._pending_text[-1])
            if not moved and not event.lost_bytes:
                return
        self.flush_text()
        for ref in moved:
            style = "bold red" if ref.truncated else "dim"
            self.console.print(f"[{style}]↳ {_escape(str(event.update_kind))} "
                               f"{_escape(sidecar_line(ref, self.fetch))}[/]", highlight=False)
        if event.lost_bytes and not moved:
            self.console.print(f"[bold red]✗ {_size(event.lost_bytes)} of this update could not be "
                               f"delivered[/]", highlight=False)
        if changed is not None and changed.status in ("completed", "failed"):
            if self.tool_filter is None or self.tool_filter(changed):
                line = _escape(tool_line(changed, self.fetch))
                if any(ref.truncated for ref in changed.sidecars):
                    line = f"[bold red]{line}[/]"
                self.console.print(line, highlight=False)
        elif event.type == COMPACTION:
            line = compaction_line(tracker.compactions[-1], len(tracker.compactions))
            self.console.print(f"[yellow]{_escape(line)}[/]", highlight=False)
        elif event.type == PROGRESS and isinstance((event.data.get("progress") or {}).get("retry"), dict):
            line = retry_line(event.data["progress"]["retry"])
            self.console.print(f"[yellow]{_escape(line)}[/]", highlight=False)
        elif event.synthetic and event.type not in ("replay_complete",):
            self.console.print(f"[magenta]{event.type}[/] {_escape(str(event.data)[:200])}", highlight=False)
        self.live.update(self._render(), refresh=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


async def drive_turn(client: DaemonClient, session_id: str, text: str, *, on_event: EventHook,
                     ask: Callable[[dict[str, Any]], str | None] | None = None,
                     attachments: Sequence[str] = ()) -> TurnTracker:
    """Prompt the session and fold its events until the turn ends; answer permission requests
    with ``ask`` (or the first allow option when ``ask`` is None)."""
    from hopline.client.content import prompt_with_attachments
    from hopline.client.turn import TurnTracker

    blocks = prompt_with_attachments(text, list(attachments)) if attachments else None
    prompt_id = await client.prompt(session_id, text, blocks=blocks)
    tracker = TurnTracker(prompt_id)
    # From event 0: the daemon journals every event, so nothing emitted before we subscribe is lost.
    async with aclosing(client.turn_events(session_id, prompt_id, last_event_id=0)) as stream:
        async for event in stream:
            if not event.synthetic and not tracker.mine(event):
                continue  # an earlier turn of this session, replayed from event 0
            changed = tracker.apply(event)
            await on_event(event, tracker, changed)
            if event.type == "permission_request":
                option = (ask or _first_allow)(event.data)
                if option is not None:
                    await client.answer_permission(session_id, str(event.data.get("requestId")), option)
    return tracker


def _first_allow(request: dict[str, Any]) -> str | None:
    options = [o for o in request.get("options") or [] if isinstance(o, dict)]
    for option in options:
        if str(option.get("kind", "")).startswith("allow"):
            return str(option.get("optionId"))
    return str(options[0].get("optionId")) if options else None


def _ask_terminal(request: dict[str, Any]) -> str | None:
    from rich.prompt import Prompt

    options = [o for o in request.get("options") or [] if isinstance(o, dict)]
    if not options:
        return None
    title = (request.get("toolCall") or {}).get("title", "a tool call")
    choices = [str(o.get("optionId")) for o in options]
    labels = ", ".join(f"{o.get('optionId')}={o.get('name', o.get('kind'))}" for o in options)
    return Prompt.ask(f"permission for {title} ({labels})", choices=choices, default=_first_allow(request))


def _json_line(obj: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


async def end_remote_session(client: DaemonClient, session_id: str, *, interrupted: bool,
                             keep: bool) -> None:
    """A run's session ends with it: on Ctrl-C its prompt is cancelled on the daemon first; then it is
    deleted (its agent stopped), unless ``keep``. Said on stderr, whatever fails."""
    from hopline.client import DaemonError

    said: list[str] = []
    if interrupted:
        try:
            cancelled = (await client.cancel(session_id) or {}).get("cancelled")
            said.append("the prompt was cancelled on the daemon" if cancelled
                        else "the prompt had already ended on the daemon")
        except DaemonError as exc:
            said.append(f"the prompt could not be cancelled ({exc})")
    if keep:
        said.append(f"session {session_id} kept (hopline sessions delete {session_id} removes it)")
    else:
        try:
            await client.delete_session(session_id)
            if interrupted:
                said.append("its session deleted")
        except DaemonError as exc:
            said.append(f"session {session_id} could not be deleted ({exc})")
    if said:
        print(("interrupted: " if interrupted else "") + "; ".join(said), file=sys.stderr, flush=True)


async def run_prompt(budget: Budget, prompt: str, *, url: str | None, token: str | None, cwd: str | None,
                     profile: str | None, as_json: bool, ask: bool,
                     scripted: dict[str, Any] | None, token_from_env: bool = True,
                     attachments: Sequence[str] = (), keep: bool = False) -> int:
    import asyncio

    from rich.console import Console

    from hopline.client import DaemonClient
    from hopline.embedded import embedded_stack

    console = Console(stderr=as_json, highlight=False)
    kept: dict[str, str] = {}  # the embedded stack's data dir, kept when a sidecar is worth fetching
    last_refs: list[SidecarRef] = []  # the turn's moved fields

    def fetch_command(session_id: str) -> FetchHint:
        from hopline.cli.sidecar import fetch_hint

        if url is not None and not keep:
            return lambda sidecar_id: "deleted with the session when the run ends (--keep keeps it)"
        return lambda sidecar_id: fetch_hint(session_id, sidecar_id, data_dir=kept.get("dir"), url=url,
                                             token_from_env=token_from_env)

    async def session(client: DaemonClient) -> int:
        session_id = await client.create_session(cwd=cwd, profile=profile,
                                                 permission_mode="ask" if ask else "auto",
                                                 scripted=scripted)
        if url is None:  # the embedded stack ends with the run, and its sessions with it
            return await turn(client, session_id)
        interrupted = False
        try:
            return await turn(client, session_id)
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task, then exits 130
            interrupted = True
            raise
        finally:
            await end_remote_session(client, session_id, interrupted=interrupted, keep=keep)

    async def turn(client: DaemonClient, session_id: str) -> int:
        if as_json:
            async def emit(event: Event, tracker: TurnTracker, changed: ToolCallView | None) -> None:
                _json_line(event.to_json())

            tracker = await drive_turn(client, session_id, prompt, on_event=emit, attachments=attachments)
            final: dict[str, Any] = {"type": "final", "text": tracker.final_text,
                                     "stopReason": tracker.stop_reason}
            if tracker.error is not None:
                final["error"] = tracker.error
            _json_line(final)
        else:
            with LiveView(console, fetch=fetch_command(session_id)) as view:
                tracker = await drive_turn(client, session_id, prompt, on_event=view.on_event,
                                           attachments=attachments,
                                           ask=_ask_terminal if ask else None)
            if tracker.degraded:
                console.print(f"[bold red]degraded turn: {_size(tracker.lost_bytes)} the agent sent "
                              "could not be delivered (see the lines above)[/]")
            if tracker.failed:
                console.print(f"[bold red]{_escape(tracker.error_summary())}[/]")
            else:  # the text itself streamed above, as it came: said once, not repeated here
                shown = "above" if tracker.final_text.strip() else "no text"
                console.print(f"[bold]final answer · {_escape(str(tracker.stop_reason))}[/] ({shown})",
                              highlight=False)
        last_refs[:] = tracker.sidecar_refs()
        return 1 if tracker.failed else 0

    if url is not None:
        async with DaemonClient(url, token or "", budget=budget) as client:
            return await session(client)
    if not as_json:
        console.print("[dim]starting the embedded stack (hopline serve on 127.0.0.1)…[/]")
    async with embedded_stack() as stack, DaemonClient(stack.url, stack.token, budget=budget) as client:
        # The stack's data dir goes with it, unless this turn moved fields to sidecars: then it is
        # kept so that `hopline sidecar ... --data-dir` can still fetch them.
        kept["dir"] = str(stack.data_dir / "data")
        code = await session(client)
        if any(ref.resolvable for ref in last_refs):
            stack.owns_data_dir = False
            console.print(f"[dim]sidecars kept in {_escape(kept['dir'])} (remove it when done)[/]")
        return code


def parse_scripted(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    import orjson

    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise typer.BadParameter(f"--scripted must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("--scripted must be a JSON object")
    return value


def prompt_from_stdin(budget: Budget) -> str:
    """``hopline run -``: the prompt is stdin, read to its end, but never past the daemon's body limit
    (``HOPLINE_DAEMON_JSON_BODY_LIMIT``): more is refused before anything starts; the client then
    sizes the whole request body against the same limit before it sends it."""
    from hopline.budget import CEILINGS_BY_KEY

    limit = budget.daemon_json_body_limit
    data = sys.stdin.buffer.read(limit + 1)
    ceiling = CEILINGS_BY_KEY["daemon_json_body_limit"]
    if len(data) > limit:
        print(f"hopline run: the prompt on stdin is over the daemon's body limit of {limit} bytes "
              f"({ceiling.name}, hop {ceiling.hop}): more than {limit} bytes came; nothing was sent",
              file=sys.stderr)
        raise typer.Exit(2)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"hopline run: the prompt on stdin is not UTF-8 (byte {exc.start})", file=sys.stderr)
        raise typer.Exit(2) from None
    if not text.strip():
        print("hopline run: the prompt on stdin is empty", file=sys.stderr)
        raise typer.Exit(2)
    return text


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        prompt: str = typer.Argument(..., help="The prompt for the agent; - reads it from stdin."),
        cwd: str = typer.Option(None, "--cwd", help="Workspace directory (default: the current one)."),
        url: str = typer.Option(None, "--url", help=f"A running daemon (default: ${URL_ENV}; neither: start "
                                "the embedded stack for this prompt)."),
        token: str = typer.Option(None, "--token", help=f"Bearer token (default: ${SERVER_TOKEN_ENV})."),
        keep: bool = typer.Option(False, "--keep", help="Keep the session on the daemon after the run "
                                  "(default: it is deleted when the run ends, Ctrl-C included)."),
        profile: str = typer.Option(None, "--profile", help="Agent profile (dev, qa_automation, ...)."),
        as_json: bool = typer.Option(False, "--json", help="Print events as JSON lines, then the final."),
        ask: bool = typer.Option(False, "--ask", help="Ask before each tool permission (default: auto)."),
        scripted: str = typer.Option(None, "--scripted",
                                     help='Hints for the scripted model, a JSON object: {"iterations": 4}.'),
        attach: list[str] = typer.Option([], "--attach", metavar="FILE",
                                         help="Attach a file: a resource_link, or an image block for "
                                              "an image file (repeatable)."),
    ) -> None:
        """Send one prompt and stream the session live (starts the embedded stack without --url)."""
        budget = budget_or_exit()
        if as_json and ask:
            raise typer.BadParameter("--ask needs the terminal; it cannot be combined with --json")
        if ask and prompt == "-":
            raise typer.BadParameter("--ask answers on the terminal; with - the prompt comes from stdin")
        hints = parse_scripted(scripted)
        workspace = os.path.abspath(cwd or os.getcwd())
        token_from_env = token is None
        target, bearer = daemon_target(url, token)
        text = prompt_from_stdin(budget) if prompt == "-" else prompt
        code = run_client("run", run_prompt(budget, text, url=target, token=bearer, cwd=workspace,
                                            profile=profile, as_json=as_json, ask=ask, scripted=hints,
                                            token_from_env=token_from_env, keep=keep,
                                            attachments=[os.path.abspath(a) for a in attach]))
        raise typer.Exit(code)
