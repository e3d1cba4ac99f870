"""`hopline demo`: the main job, a gate run (SPEC C-3, K-5).

Builds the sample pull request (``scripted.sample_pull_request``: large test logs, one planted issue per
gate domain but QA automation's), starts the embedded stack (daemon, gateway, offline scripted model)
and runs ``hopline gate --fix`` on it: the four gate agents review ``main..feature`` (all four at once)
while the dev session waits in ``awaiting_gate``; the dev agent fixes the findings of the failing
gates and the gate runs again. The live view has one row per gate; the summary shows every gate's
verdict within the ceiling, the largest llm-turn body against the engine ceiling and the gateway
limit, the compactions, the sidecars and the bytes they kept off the wire, the largest pipe frame,
and the gateway's 413s: zero. Exit 0 when the last round passes with no 413.

``--naive`` replays the original incident under its rules (K-5: the gateway's implicit ``100kb``
limit, the content-only estimate, no transport bound): the gates die with 413 of origin ``code``,
each is retried once and ends ``error`` (never a pass), and the dev session stays ``awaiting_gate``
until every gate is terminal (K-2) instead of moving on. Exit 1 when it is reproduced (2 when not,
or when the stack did not start).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hopline.budget import CEILINGS_BY_KEY, NAIVE_ENV
from hopline.cli._common import NAIVE_GATEWAY_LIMIT, budget_or_exit, run_client
from hopline.vocabulary import GATE_AGENTS

if TYPE_CHECKING:
    from rich.console import Console

    from hopline.budget import Budget
    from hopline.client import DaemonStatus

DEMO_TOOLS_PER_ITERATION = 3
GATE_CONCURRENCY_ENV = CEILINGS_BY_KEY["gate_concurrency"].name
# The iterations a demo gate agent explores the change for: with its checks and answering, each gate
# runs 15 to 18 iterations and its bodies pass the compaction trigger twice, before any ceiling; more
# would show the same thing again at the price of every turn's bytes through each hop.
DEMO_EXPLORE_ITERATIONS = 12


def naive_env() -> dict[str, str]:
    # The naive rules reach the stack through the daemon's environment, inherited by its agents.
    return {CEILINGS_BY_KEY["api_json_body_limit"].name: NAIVE_GATEWAY_LIMIT, NAIVE_ENV: "1"}


def stack_env(naive: bool) -> dict[str, str]:
    """The demo stack's environment: its one gate run's four agents review at once (unless the
    caller set ``HOPLINE_GATE_CONCURRENCY``), and the naive rules with ``--naive``."""
    env = naive_env() if naive else {}
    if GATE_CONCURRENCY_ENV not in os.environ:
        env[GATE_CONCURRENCY_ENV] = str(len(GATE_AGENTS))
    return env


def demo_hints() -> dict[str, Any]:
    return {"seed": 0, "iterations": DEMO_EXPLORE_ITERATIONS, "toolsPerIteration": DEMO_TOOLS_PER_ITERATION}


def gateway_statuses(metrics_text: str) -> dict[str, int]:
    """Gateway responses by status from the Prometheus text of ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "hopline_gateway_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                status = sample.labels.get("status", "?")
                counts[status] = counts.get(status, 0) + int(sample.value)
    return counts


def _ceiling(status: Mapping[str, Any], name: str) -> int | None:
    for c in (status.get("budget") or {}).get("ceilings") or []:
        if c.get("name") == name and "bytes" in c:
            return int(c["bytes"])
    return None


def _all_reports(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [a for r in result.get("history") or [] for a in r.get("agents") or []] + list(result.get("agents")
                                                                                         or [])


def dev_stayed_awaiting(result: Mapping[str, Any]) -> bool:
    """K-2 held: the dev session left ``awaiting_gate`` only once every gate of the round had ended."""
    changes = result.get("devStates") or []
    reports = _all_reports(result)
    for change in changes:
        if change.get("previous") != "awaiting_gate" or change.get("event") == "cancelled":
            continue
        ended = [a.get("endedAt") for a in reports if a.get("round") == change.get("round")]
        if not ended or any(e is None or e > change["at"] + 0.001 for e in ended):
            return False
    return bool(changes)


def build_summary(*, naive: bool, result: Mapping[str, Any], status: DaemonStatus, statuses: dict[str, int],
                  budget: Budget, elapsed: float) -> dict[str, Any]:
    pipe = ((status.get("runtime") or {}).get("perf") or {}).get("pipe") or {}
    inbound = pipe.get("inbound") or {}
    outbound = pipe.get("outbound") or {}
    largest_dir = "inbound" if int(inbound.get("maxBytes") or 0) >= int(outbound.get("maxBytes") or 0) \
        else "outbound"
    reports = _all_reports(result)
    sidecars: dict[str, Any] = {"seenInEvents": sum(int(a.get("sidecars") or 0) for a in reports),
                                "bytesInEvents": sum(int(a.get("sidecarBytes") or 0) for a in reports)}
    store = status.get("sidecars") if isinstance(status.get("sidecars"), dict) else None
    if store is not None:
        for key in ("bytesKeptOffWire", "fallbacks"):
            sidecars[key] = store.get(key)
    errors = [a["error"] for a in reports if isinstance(a.get("error"), dict)]
    turn_error = next((e for e in errors if e.get("status") == 413), errors[0] if errors else None)
    large = status.get("largeFrames") or {}
    return {
        "mode": "naive" if naive else "gate",
        "exitCode": result.get("exitCode"),
        "state": result.get("state"),
        "roundsRun": result.get("roundsRun"),
        "gates": [{k: a.get(k) for k in ("agent", "round", "verdict", "iterations", "maxIterations",
                                         "compactions", "summarizers", "summarizerErrors", "maxBodyBytes",
                                         "ceilingBytes", "http413s", "attempt", "stalls", "sidecars")}
                  | {"findings": len(a.get("findings") or [])}
                  for a in reports],
        "verdicts": {a["agent"]: a.get("verdict") for a in result.get("agents") or []},
        "iterations": sum(int(a.get("iterations") or 0) for a in reports),
        "compactions": {"count": sum(int(a.get("compactions") or 0) for a in reports),
                        # the compactions whose model summary failed (the extractive one was used), and why
                        "summarizerErrors": [e for a in reports for e in a.get("summarizerErrors") or []]},
        "largestBodyBytes": max((int(a.get("maxBodyBytes") or 0) for a in reports), default=0),
        "engineCeilingBytes": _ceiling(status, CEILINGS_BY_KEY["transport_max_body_bytes"].name)
        or budget.transport_max_body_bytes,
        "gatewayLimitBytes": _ceiling(status, CEILINGS_BY_KEY["api_json_body_limit"].name),
        "largestPipeFrame": {"bytes": int(max(int(inbound.get("maxBytes") or 0), int(outbound.get("maxBytes")
                                                                                     or 0))),
                             "direction": largest_dir},
        "largeFrames": {"logged": large.get("logged", 0), "suppressed": large.get("suppressed", 0)},
        "framesDropped": status.get("framesDropped", 0),
        "sidecars": sidecars,
        "gatewayResponses": statuses,
        "gateway413s": statuses.get("413", 0),
        "turnError": turn_error,
        "devStates": result.get("devStates") or [],
        "devStayedAwaiting": dev_stayed_awaiting(result),
        "devTurns": result.get("devTurns") or [],
        "sandbox": result.get("sandbox"),
        "testCommand": result.get("testCommand"),
        # qa_automation's real test runs, round by round: what ran and with what result
        "testRuns": [{"round": a.get("round"), "verdict": a.get("verdict"), "summary": a.get("summary")}
                     for a in reports if a.get("agent") == "qa_automation"],
        "analyzers": analyzers_of(reports),
        "gate": result,
        "elapsedSeconds": round(elapsed, 2),
    }


def analyzers_of(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each analyzer the gates named in their verdicts: its status (``ran`` when it ran for any of
    them), the agents it ran for, and its findings on added lines (all rounds)."""
    out: dict[str, dict[str, Any]] = {}
    for report in reports:
        for analyzer in report.get("analyzers") or []:
            row = out.setdefault(str(analyzer.get("name")), {"status": analyzer.get("status"), "agents": [],
                                                             "findings": 0})
            if analyzer.get("status") == "ran":
                row["status"] = "ran"
                if report.get("agent") not in row["agents"]:
                    row["agents"].append(report.get("agent"))
            row["findings"] += int(analyzer.get("findings") or 0)
    for row in out.values():  # in the gates' order, whichever ended first
        row["agents"].sort(key=lambda a: GATE_AGENTS.index(a) if a in GATE_AGENTS else len(GATE_AGENTS))
    return out


def analyzers_said(analyzers: dict[str, dict[str, Any]]) -> str:
    """``ruff (appsec, qa_performance_security: 3 findings); bandit: missing``."""
    return "; ".join(f"{name} ({', '.join(row['agents'])}: {row['findings']} findings)"
                     if row["status"] == "ran" else f"{name}: {row['status']}"
                     for name, row in analyzers.items())


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from hopline.cli.gate import print_result
    from hopline.cli.run import summarizer_note
    from hopline.cli.status import exact_size as size

    print_result(console, summary["gate"])
    table = Table(title=f"hopline demo — {summary['mode']} run: every hop's budget", title_justify="left",
                  show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("gate", f"{summary['state']}, {summary['roundsRun']} round(s), exit {summary['exitCode']}")
    table.add_row("iterations (all gates)", str(summary["iterations"]))
    failed = summary["compactions"]["summarizerErrors"]
    table.add_row("compactions", str(summary["compactions"]["count"])
                  + (f" [bold red]({escape(summarizer_note(failed))})[/]" if failed else ""))
    table.add_row("largest llm-turn body", size(summary["largestBodyBytes"]))
    table.add_row("  engine ceiling", size(summary["engineCeilingBytes"]))
    table.add_row("  gateway limit", size(summary["gatewayLimitBytes"]))
    frame = summary["largestPipeFrame"]
    table.add_row("largest pipe frame", f"{size(frame['bytes'])} {frame['direction']}")
    large = summary["largeFrames"]
    table.add_row("large-frame records", f"{large['logged']} logged, {large['suppressed']} suppressed")
    table.add_row("frames dropped", str(summary["framesDropped"]))
    sc = summary["sidecars"]
    table.add_row("sidecars", f"{sc['seenInEvents']} tool outputs ({size(sc['bytesInEvents'])})")
    if "bytesKeptOffWire" in sc:
        table.add_row("  kept off the wire", size(sc.get("bytesKeptOffWire")))
    responses = sorted(summary["gatewayResponses"].items())
    table.add_row("gateway responses", ", ".join(f"{k}: {v}" for k, v in responses) or "-")
    style = "bold green" if summary["gateway413s"] == 0 else "bold red"
    table.add_row("413s", f"[{style}]{summary['gateway413s']}[/]")
    states = summary["devStates"]
    if states:
        held = "yes" if summary["devStayedAwaiting"] else "[bold red]no[/]"
        table.add_row("dev session", " → ".join([states[0]["previous"], *(c["state"] for c in states)]))
        table.add_row("  awaiting_gate until every gate ended", held)
    error = summary["turnError"]
    if error is not None:
        table.add_row("gate turn error", f"[bold red]origin {error.get('origin')}[/], status "
                      f"{error.get('status', '-')}, hop {error.get('hop', '-')}, body "
                      f"{size(error.get('observed'))}, limit {size(error.get('limit'))}")
    sandbox = summary.get("sandbox") or {}
    if sandbox:
        table.add_row("sandbox for the PR's code", str(sandbox.get("kind")))
    for run in summary.get("testRuns") or []:
        said = next((part for part in str(run.get("summary")).split("; ") if part.startswith("ran ")),
                    str(run.get("summary")))
        table.add_row(f"qa_automation, round {run.get('round')}", f"{run.get('verdict')}: {escape(said)}")
    if summary.get("analyzers"):
        table.add_row("analyzers", escape(analyzers_said(summary["analyzers"])))
    table.add_row("elapsed", f"{summary['elapsedSeconds']} s")
    console.print(table)


async def run_demo(budget: Budget, *, naive: bool, as_json: bool) -> tuple[int, dict[str, Any]]:
    from rich.console import Console

    from hopline.cli.gate import GateView, follow_gate
    from hopline.client import DaemonClient
    from hopline.embedded import embedded_stack
    from hopline.scripted.sample_pull_request import make_sample_pull_request

    console = Console(stderr=as_json, highlight=False, quiet=as_json)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hopline-demo-") as tmp:
        repo, base, head = make_sample_pull_request(Path(tmp) / "sample-pr")
        mode = ("naive (the incident's rules: gateway limit 100kb, content-only estimate)" if naive
                else "gate --fix")
        console.print(f"[bold]hopline demo[/] — {mode}; a sample pull request ({base[:8]}..{head[:8]}) whose "
                      "test logs make large tool outputs; starting the embedded stack…")
        async with embedded_stack(env=stack_env(naive)) as stack, \
                DaemonClient(stack.url, stack.token, budget=budget) as client:
            gate_id = await client.start_gate(str(repo), base=base, head=head, fix=True,
                                              scripted=demo_hints())

            async def frames(view: GateView) -> str:
                return frames_line(await client.status())

            result = await follow_gate(client, gate_id, console=None if as_json else console, extra=frames)
            status = await client.status()
            statuses = gateway_statuses(await client.metrics())
    summary = build_summary(naive=naive, result=result, status=status, statuses=statuses, budget=budget,
                            elapsed=time.monotonic() - started)
    return _exit_code(naive, summary), summary


def frames_line(status: DaemonStatus) -> str:
    """The daemon's side of the live line: largest pipe frame, large-frame records, sidecars."""
    from hopline.budget import format_size

    pipe = ((status.get("runtime") or {}).get("perf") or {}).get("pipe") or {}
    largest = max(int((pipe.get(d) or {}).get("maxBytes") or 0) for d in ("inbound", "outbound"))
    large = status.get("largeFrames") or {}
    kept = (status.get("sidecars") or {}).get("bytesKeptOffWire") or 0
    return (f"largest pipe frame {format_size(largest)} │ large frames {large.get('logged', 0)} │ "
            f"sidecars kept {format_size(int(kept))} off the wire")


def _exit_code(naive: bool, summary: dict[str, Any]) -> int:
    if naive:
        error = summary["turnError"] or {}
        reproduced = (error.get("origin") == "code" and summary["gateway413s"] > 0
                      and summary["devStayedAwaiting"] and "pass" not in summary["verdicts"].values())
        return 1 if reproduced else 2
    ok = summary["exitCode"] == 0 and summary["gateway413s"] == 0
    return 0 if ok else (2 if summary["exitCode"] == 2 else 1)


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        naive: bool = typer.Option(False, "--naive", help="Run without hopline's budget (a 100kb gateway "
                                   "limit, a text-only estimate): the gates die with 413 of origin code."),
        as_json: bool = typer.Option(False, "--json", help="Print only the summary, as one JSON object."),
    ) -> None:
        """Gate a sample pull request with the four gate agents and a fixing dev agent; every hop's budget."""
        import orjson
        from rich.console import Console

        code, summary = run_client("demo", run_demo(budget_or_exit(), naive=naive, as_json=as_json))
        if as_json:
            typer.echo(orjson.dumps(summary).decode())
        else:
            console = Console(highlight=False)
            print_summary(console, summary)
            if naive and code == 1:
                console.print("[bold red]reproduced the original incident:[/] the gateway refused the gates' "
                              "bodies with 413; origin [bold]code[/] (our side built a request the transport "
                              "refused), not model. The dev session stayed [bold]awaiting_gate[/] until "
                              "every gate had ended, with error verdicts: it never moved on as if they had "
                              "passed.")
            elif naive:
                console.print("[yellow]the naive run did not reproduce the incident[/]")
        raise typer.Exit(code)
