"""`hopline gate`: review a pull request's ``base..head`` with the four gate agents (SPEC K-1).

Without ``--url`` it starts the embedded stack (``hopline serve`` on loopback) for the run. It posts
``POST /gate``, follows ``GET /gate/{id}/events`` with a live line per gate (its item, iteration,
compactions, largest body against the ceiling, 413s), and ends with the summary table, the
findings, and the dev session's states when one is attached. ``--format json`` (``--json``) prints
the result of ``GET /gate/{id}`` instead (``devStates`` included); ``--format github`` prints the
findings as GitHub Actions annotations (:mod:`hopline.gate.github`) and the summary; ``--sarif
FILE`` writes it as SARIF 2.1.0. Exit
code: 0 every gate passed, 1 a gate failed, 2 a gate error (or the run could not finish).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import aclosing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hopline.budget import SERVER_TOKEN_ENV as TOKEN_ENV
from hopline.budget import URL_ENV
from hopline.cli._common import budget_or_exit, daemon_target, run_client
from hopline.vocabulary import (
    DEV_STATE,
    GATE_COMPLETE,
    GATE_FIX,
    GATE_ITEM,
    GATE_PROGRESS,
    GATE_ROUND,
    GATE_STARTED,
    GATE_VERDICT,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from hopline.budget import Budget
    from hopline.client import DaemonClient, Event, GateRun

VERDICT_STYLES = {"pass": "bold green", "fail": "bold red", "error": "bold magenta"}


def _size(value: Any) -> str:
    from hopline.budget import format_size

    return format_size(int(value)) if isinstance(value, int) else "-"


def body_against_ceiling(row: dict[str, Any]) -> str:
    """A gate's largest llm-turn body against the ceiling that bounds it: the engine ceiling, or,
    when a hop refused a body as too large (413), the limit that refused it and that hop."""
    found = row.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    if error.get("status") == 413 and isinstance(error.get("limit"), int):
        largest = max(int(row.get("maxBodyBytes") or 0), int(error.get("observed") or 0))
        return f"{_size(largest)} / {_size(error['limit'])} ({error.get('hop')} refused it)"
    return f"{_size(row.get('maxBodyBytes'))} / {_size(row.get('ceilingBytes'))}"


class GateView:
    """The live state of a run from its events: one row per gate agent, the dev state, the round."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.round = 0
        self.dev_state: str | None = None
        self.result: GateRun | None = None
        self.notes: list[str] = []  # what the log above the table says (stalls, retries, dev states)

    def apply(self, event: Event) -> str | None:
        """Fold one event in; returns a line worth printing above the table, if any."""
        data = event.data
        agent = data.get("agent")
        if event.type == GATE_STARTED:
            return started_line(data)
        if event.type == GATE_ROUND:
            self.round = int(data.get("round") or 0)
            self.rows = {}  # each round's table shows its own states, never the last round's verdicts
            return f"round {self.round}: head {str(data.get('head'))[:12]}"
        if event.type == GATE_FIX:
            return fix_line(data)
        row = self.rows.setdefault(str(agent), {"agent": agent}) if isinstance(agent, str) else None
        if event.type == GATE_ITEM and row is not None:
            row["item"] = data.get("item")
            if data.get("item") in ("gate_stalled", "gate_retrying", "gate_error"):
                return f"{agent}: {data.get('item')}" + (f" ({data['reason']})" if data.get("reason") else "")
        elif event.type == GATE_PROGRESS and row is not None:
            row.update({k: data.get(k) for k in ("iteration", "maxIterations", "maxBodyBytes", "ceilingBytes",
                                                 "compactions", "extractiveSummaries", "http413s")})
        elif event.type == GATE_VERDICT and row is not None:
            row.update(data)
            return (f"{agent}: {data.get('verdict')} — {len(data.get('findings') or [])} findings, "
                    f"{data.get('iterations')} iterations, {data.get('compactions')} compactions")
        elif event.type == DEV_STATE:
            self.dev_state = str(data.get("state"))
            return f"dev session: {data.get('previous')} → {data.get('state')} ({data.get('event')})"
        elif event.type == GATE_COMPLETE:
            self.result = data.get("result")
        return None

    def render(self) -> RenderableType:
        from rich.table import Table

        table = Table(title=f"gate round {self.round}" + (f" · dev session {self.dev_state}"
                                                          if self.dev_state else ""),
                      title_justify="left")
        for column in ("gate", "item", "iteration", "compactions", "largest body / ceiling", "413s",
                       "verdict"):
            table.add_column(column)
        for row in self.rows.values():
            verdict = row.get("verdict")
            # compactions whose model summary failed: counted while it runs, listed in its verdict
            extractive = row.get("extractiveSummaries") or len(row.get("summarizerErrors") or [])
            table.add_row(str(row.get("agent")), str(row.get("item") or "-"),
                          f"{row.get('iteration') or 0}/{row.get('maxIterations') or '?'}",
                          str(row.get("compactions") or 0) + (f" ([red]{extractive} extractive[/])"
                                                              if extractive else ""),
                          body_against_ceiling(row), str(row.get("http413s") or 0),
                          f"[{VERDICT_STYLES.get(str(verdict), '')}]{verdict}[/]" if verdict else "…")
        return table


def started_line(data: dict[str, Any]) -> str:
    """What the run says at its start: which sandbox runs the PR's code, which test command."""
    if data.get("nothingToReview"):
        return str(data["nothingToReview"])
    sandbox = data.get("sandbox") or {}
    test = data.get("testCommand") or {}
    kind = sandbox.get("kind")
    shown = (f"sandbox: {kind} ({sandbox.get('detail')})" if kind != "none"
             else f"sandbox: none: the pull request's code runs unsandboxed ({sandbox.get('detail')})")
    python = data.get("python") or {}
    ran_by = (f", run by {python.get('path')} ({python.get('source')})" if python.get("path")
              else ", run by hopline's own interpreter" if python else "")
    return shown + (f"; test command: {test.get('shown')} ({test.get('source')}){ran_by}" if test
                    else "; no test command found")


def fix_line(turn: dict[str, Any]) -> str:
    """A dev fix's outcome: its commit and what verified it, or why no commit was made."""
    verification = turn.get("verification") or {}
    head = verification.get("headTests") or {}
    told = head.get("summary") or f"exit {head.get('exitCode')}"
    ran = f"; tests at the fix's head: {told}" if head else ""
    commands = turn.get("commands") or []
    if commands:
        kinds = sorted({str(c.get("sandbox")) for c in commands})
        ran += f"; the dev agent's {len(commands)} commands ran in the sandbox: {', '.join(kinds)}"
    if turn.get("commit"):
        return (f"dev fix after round {turn.get('round')}: commit {turn['commit']} (git cherry-pick "
                f"{str(turn['commit'])[:12]}), verified: {turn.get('reason')}{ran}")
    return f"dev fix after round {turn.get('round')}: fix_failed: {turn.get('reason')}{ran}"


def finding_line(agent: str, finding: dict[str, Any]) -> str:
    """One finding as a CI log shows it, whole: ``error src/x.py:13 appsec/hardcoded-credential: ...``."""
    where = str(finding.get("file")) + (f":{finding['line']}" if finding.get("line") else "")
    message = " ".join(str(finding.get("message")).split())
    return f"{finding.get('severity')} {where} {agent}/{finding.get('rule')}: {message}"


def plain_summary(result: Mapping[str, Any]) -> list[str]:
    """The run's summary as plain lines (no table, nothing cut): one per gate, then the exit."""
    lines = []
    for agent in result.get("agents") or []:
        findings = agent.get("findings") or []
        errors = sum(1 for f in findings if f.get("severity") == "error")
        lines.append(f"{agent.get('agent')}: {agent.get('verdict')}, {len(findings)} findings ({errors} "
                     f"errors), "
                     f"{agent.get('iterations')} iterations, {agent.get('compactions')} compactions, "
                     f"{agent.get('http413s')} 413s — {' '.join(str(agent.get('summary')).split())}")
    lines.append(f"hopline gate {str(result.get('base', ''))[:12]}..{str(result.get('finalHead', ''))[:12]}: "
                 f"{result.get('roundsRun')} round(s), exit {result.get('exitCode')}")
    return lines


def summary_table(result: Mapping[str, Any]) -> RenderableType:
    """Per gate: verdict, findings, iterations, compactions (and any whose model summary failed),
    largest body against the ceiling, 413s."""
    from rich.markup import escape
    from rich.table import Table

    from hopline.cli.run import summarizer_note

    table = Table(title=f"hopline gate — {result.get('base', '')[:12]}..{result.get('finalHead', '')[:12]}, "
                        f"{result.get('roundsRun')} round(s), exit {result.get('exitCode')}",
                  title_justify="left")
    for column in ("gate", "verdict", "findings", "iterations", "compactions", "largest body / ceiling",
                   "413s", "attempts"):
        table.add_column(column, justify="left" if column in ("gate", "verdict") else "right")
    for agent in result.get("agents") or []:
        verdict = str(agent.get("verdict"))
        findings = agent.get("findings") or []
        errors = sum(1 for f in findings if f.get("severity") == "error")
        omitted = f" (+{agent['omittedFindings']} omitted)" if agent.get("omittedFindings") else ""
        style = "bold green" if agent.get("http413s") == 0 else "bold red"
        failed = agent.get("summarizerErrors") or []
        compactions = str(agent.get("compactions")) + (f" [red]({escape(summarizer_note(failed))})[/]"
                                                       if failed else "")
        table.add_row(str(agent.get("agent")), f"[{VERDICT_STYLES.get(verdict, '')}]{verdict}[/]",
                      f"{len(findings)} ({errors} errors){omitted}", str(agent.get("iterations")),
                      compactions, body_against_ceiling(agent),
                      f"[{style}]{agent.get('http413s')}[/]", str(agent.get("attempt")))
    return table


def print_result(console: Console, result: Mapping[str, Any]) -> None:
    """Every round's findings, the dev fixes, and the summary: a table on a terminal, plain lines
    elsewhere (a CI log: nothing cut, every finding names its agent and rule)."""
    from rich.markup import escape

    tty = console.is_terminal
    if result.get("nothingToReview"):
        console.print(str(result["nothingToReview"]), highlight=False, markup=False)
    if tty and result.get("agents"):
        console.print(summary_table(result))
    history = [(r.get("round"), r.get("head"), r.get("agents") or []) for r in result.get("history") or []]
    rounds = [*history, (result.get("roundsRun"), result.get("finalHead"), result.get("agents") or [])]
    for number, head, agents in rounds if result.get("agents") else []:
        if len(rounds) > 1:
            console.print(f"round {number} (head {str(head)[:12]}):", highlight=False, markup=False)
        for agent in agents:
            for finding in agent.get("findings") or []:
                line = finding_line(str(agent.get("agent")), finding)
                if tty:
                    style = "red" if finding.get("severity") == "error" else "yellow"
                    console.print(f"  [{style}]{escape(line)}[/]", highlight=False, soft_wrap=True)
                else:
                    console.print("  " + line, highlight=False, markup=False, soft_wrap=True)
            if agent.get("verdict") == "error":
                console.print(f"  {agent.get('agent')}: {agent.get('summary')}", highlight=False,
                              markup=False,
                              soft_wrap=True)
    if result.get("devStates"):
        states = " → ".join([result["devStates"][0]["previous"], *(c["state"] for c in result["devStates"])])
        console.print(f"dev session: {states}", highlight=False, markup=False)
    for turn in result.get("devTurns") or []:
        console.print(fix_line(turn), highlight=False, markup=False, soft_wrap=True)
    if not tty:
        for line in plain_summary(result):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    if result.get("error"):
        console.print(f"gate run {result.get('state')}: {result['error']}", style="bold red", highlight=False,
                      markup=False, soft_wrap=True)


async def follow_gate(client: DaemonClient, gate_id: str, *, console: Console | None,
                      extra: Any = None) -> GateRun:
    """Follow a run's events to ``gate_complete``, live on ``console`` (None: silently); its result.

    ``extra(view)`` (optional, awaited once per gate progress) returns a line shown under the table."""
    from rich.live import Live
    from rich.markup import escape
    from rich.text import Text

    view = GateView()
    tty = console is not None and console.is_terminal
    live = Live(view.render(), console=console, auto_refresh=False, transient=False) if tty else None
    footer = ""
    if live is not None:
        live.start()
    try:
        async with aclosing(client.gate_events(gate_id)) as events:
            async for event in events:
                line = view.apply(event)
                if console is not None and line:
                    console.print(escape(line) if tty else line, highlight=False, markup=tty, soft_wrap=True)
                if live is not None and console is not None:
                    if extra is not None and event.type == GATE_PROGRESS:
                        footer = await extra(view)
                    if event.type != GATE_COMPLETE:
                        from rich.console import Group

                        live.update(Group(view.render(), Text(footer, style="bold cyan")) if footer
                                    else view.render(), refresh=True)
                if event.type == GATE_COMPLETE:
                    break
    finally:
        if live is not None:
            live.stop()
    return view.result if view.result is not None else await client.gate(gate_id)


def write_sarif(path: Path, result: Mapping[str, Any]) -> None:
    import orjson

    from hopline.gate.sarif import to_sarif

    path.write_bytes(orjson.dumps(to_sarif(result), option=orjson.OPT_INDENT_2))


async def run_gate(budget: Budget, *, url: str | None, token: str | None, repo: str, base: str | None,
                   head: str | None, agents: list[str] | None, dev_session: str | None, fix: bool,
                   rounds: int | None, scripted: dict[str, Any] | None, output: str,
                   sarif: Path | None, test_command: str | None = None,
                   allow_unsandboxed: bool = False, python: str | None = None) -> int:
    import orjson
    from rich.console import Console

    from hopline.client import DaemonClient
    from hopline.embedded import embedded_stack

    as_json = output == "json"
    console = Console(stderr=as_json, highlight=False, quiet=as_json)

    async def one(client: DaemonClient) -> int:
        gate_id = await client.start_gate(repo, base=base, head=head, agents=agents,
                                          dev_session_id=dev_session, fix=fix, rounds=rounds,
                                          scripted=scripted, test_command=test_command,
                                          allow_unsandboxed=allow_unsandboxed, python=python)
        try:
            result = await follow_gate(client, gate_id, console=None if as_json else console)
        except BaseException:
            import contextlib

            with contextlib.suppress(Exception):
                await client.cancel_gate(gate_id)  # an interrupted client leaves no run behind
            raise
        if sarif is not None:
            write_sarif(sarif, result)
        if as_json:
            sys.stdout.write(orjson.dumps(result).decode() + "\n")
        elif output == "github":
            from hopline.gate.github import annotate

            sys.stdout.write("".join(line + "\n" for line in annotate(result)))
            for line in plain_summary(result):
                console.print(line, highlight=False, markup=False, soft_wrap=True)
        else:
            print_result(console, result)
            if sarif is not None:
                console.print(f"SARIF 2.1.0 written: {len(result.get('agents') or [])} runs", highlight=False)
        code = result.get("exitCode")
        return int(code) if isinstance(code, int) else 2

    if url is not None:
        async with DaemonClient(url, token or "", budget=budget) as client:
            return await one(client)
    console.print("[dim]starting the embedded stack (hopline serve on 127.0.0.1)…[/]")
    async with embedded_stack() as stack, DaemonClient(stack.url, stack.token, budget=budget) as client:
        return await one(client)


def check_gate_arguments(budget: Budget, *, agents: list[str], rounds: int | None, fix: bool,
                         dev_session: str | None) -> None:
    """What the daemon would refuse with a 422 or 400, refused here first, as the CLI's own usage error,
    before any stack starts."""
    from hopline.budget import CEILINGS_BY_KEY
    from hopline.vocabulary import GATE_AGENTS

    for name in agents:
        if name not in GATE_AGENTS:
            raise typer.BadParameter(f"{name!r} is not a gate agent; choose from {', '.join(GATE_AGENTS)}",
                                     param_hint="--agent")
    if rounds is not None and not 1 <= rounds <= budget.gate_max_rounds:
        setting = CEILINGS_BY_KEY["gate_max_rounds"].name
        raise typer.BadParameter(f"{rounds} is not between 1 and {budget.gate_max_rounds} ({setting})",
                                 param_hint="--rounds")
    if fix and dev_session is not None:
        raise typer.BadParameter("--fix makes its own dev session; --dev-session attaches one that waits: "
                                 "give one of them", param_hint="--dev-session")


def check_repository(budget: Budget, repo: str, *, base: str | None, head: str | None) -> None:
    """What the daemon would answer with a 422 (no such directory, not a git work tree, a revision
    that names no commit, no base to take), refused here with the same rules (:mod:`hopline.harness.git`)
    before any stack starts: exit 2."""
    from pathlib import Path

    from hopline.harness.git import RepoError, default_base, repository_root, resolve_commit

    try:
        root = repository_root(Path(repo), budget)
        head_commit = resolve_commit(root, budget, head or "HEAD", "head")
        if base is not None:
            resolve_commit(root, budget, base, "base")
        else:
            default_base(root, budget, head_commit)
    except RepoError as exc:
        print(f"hopline gate: {exc} (--repo {repo})", file=sys.stderr)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    @app.command()
    def gate(
        repo: str = typer.Option(None, "--repo", help="The git repository (default: the current directory)."),
        base: str = typer.Option(None, "--base", help="Base revision (default: the merge base of head with "
                                 "the upstream, or main)."),
        head: str = typer.Option(None, "--head", help="Head revision (default: HEAD)."),
        url: str = typer.Option(None, "--url", help=f"A running daemon (default: ${URL_ENV}; neither: start "
                                "the embedded stack for the run)."),
        token: str = typer.Option(None, "--token", help=f"Bearer token (default: ${TOKEN_ENV})."),
        as_json: bool = typer.Option(False, "--json", help="Print the run's result as one JSON object "
                                     "(--format json)."),
        output: str = typer.Option("text", "--format", help="text (a table on a terminal, plain lines in a "
                                   "log), json (the run's result), or github (GitHub Actions annotations)."),
        sarif: str = typer.Option(None, "--sarif", help="Write the verdicts as SARIF 2.1.0 to this file."),
        dev_session: str = typer.Option(None, "--dev-session", help="Attach this dev session: it stays "
                                        "awaiting_gate until every gate has a verdict."),
        fix: bool = typer.Option(False, "--fix", help="Make a dev session that fixes the findings of a "
                                 "failing round on the head checkout; the gate then runs again."),
        rounds: int = typer.Option(None, "--rounds", help="Gate rounds with --fix (default 2)."),
        agent: list[str] = typer.Option(None, "--agent", help="Only this gate agent (repeatable)."),
        scripted: str = typer.Option(None, "--scripted", help="Hints for the scripted model (JSON object)."),
        test_cmd: str = typer.Option(None, "--test-cmd", help="The test command qa_automation runs (default: "
                                     "the base's .hopline/gate.toml, else detected: pytest, go, cargo, npm, "
                                     "make)."),
        allow_unsandboxed: bool = typer.Option(
            False, "--allow-unsandboxed", help="Run the pull request's code even where no sandbox (bwrap, "
                                               "unshare) runs."),
        python: str = typer.Option(None, "--python", help="The project's interpreter, which runs its "
                                   "tests (default: python = in the base's .hopline/gate.toml, else the "
                                   "repository's .venv/bin/python, else hopline's own)."),
    ) -> None:
        """Review base..head with the four gate agents (exit 0 every gate passed, 1 a fail, 2 an error)."""
        from hopline.cli.run import parse_scripted

        if output not in ("text", "json", "github"):
            raise typer.BadParameter(f"{output!r} is not one of text, json, github", param_hint="--format")
        budget = budget_or_exit()
        check_gate_arguments(budget, agents=agent or [], rounds=rounds, fix=fix, dev_session=dev_session)
        workspace = os.path.abspath(repo or os.getcwd())
        target, bearer = daemon_target(url, token)
        if target is None:  # the embedded stack: the repository is checked here, before it starts
            check_repository(budget, workspace, base=base, head=head)
        code = run_client("gate", run_gate(
            budget, url=target, token=bearer, repo=workspace, base=base, head=head,
            agents=list(agent) if agent else None, dev_session=dev_session, fix=fix, rounds=rounds,
            scripted=parse_scripted(scripted), output="json" if as_json else output,
            sarif=Path(sarif) if sarif else None, test_command=test_cmd,
            allow_unsandboxed=allow_unsandboxed, python=os.path.abspath(python) if python else None))
        raise typer.Exit(code)
