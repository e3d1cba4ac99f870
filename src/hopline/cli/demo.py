"""`hopline demo`: the main job (SPEC C-3).

Creates a sample workspace whose tools produce large outputs, starts the embedded stack (daemon,
gateway, offline scripted model), runs a gate session (``qa_automation``, 60 iterations) with the live
progress of ``hopline run``, and ends with a summary table: iterations, compactions and their
triggers, the largest llm-turn body against the engine ceiling and the gateway limit, the largest
pipe frame, large-frame records, sidecars and the bytes they kept off the wire, and the gateway's
413s (zero).

``--naive`` replays the seed's incident: the stack runs with the gateway limit the seed had
implicitly (Express's ``100kb``) and the harness's naive rules (content-only estimate, no transport
bound). The turn fails with a 413 classified as origin ``code``; the summary names the hop and the
sizes, and the command exits 1 (2 when the incident was not reproduced or the stack did not start).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hopline.cli._common import NAIVE_GATEWAY_LIMIT, budget_or_exit
from hopline.vocabulary import NAIVE_ENV

if TYPE_CHECKING:
    from rich.console import Console

    from hopline.budget import Budget
    from hopline.client import Event
    from hopline.client.turn import ToolCallView, TurnTracker

DEMO_PROFILE = "qa_automation"
DEMO_PROMPT = "Gate this change: run the test suite, read the test logs and reports, and report failures."
# The naive rules reach the stack through the daemon's environment, inherited by its agents.
DEMO_TOOLS_PER_ITERATION = 3


def naive_env() -> dict[str, str]:
    return {"API_JSON_BODY_LIMIT": NAIVE_GATEWAY_LIMIT, NAIVE_ENV: "1"}


def demo_hints(max_iterations: int) -> dict[str, Any]:
    # The last iteration is the final answer, so the loop ends with end_turn at max_iterations.
    # (Naive mode reaches the agent as HOPLINE_NAIVE=1 in the stack's environment, not as a hint.)
    return {"seed": 0, "iterations": max(0, max_iterations - 1),
            "toolsPerIteration": DEMO_TOOLS_PER_ITERATION}


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


def _ceiling(status: dict[str, Any], name: str) -> int | None:
    for c in (status.get("budget") or {}).get("ceilings") or []:
        if c.get("name") == name and "bytes" in c:
            return int(c["bytes"])
    return None


def build_summary(*, naive: bool, tracker: TurnTracker, status: dict[str, Any], statuses: dict[str, int],
                  budget: Budget, elapsed: float) -> dict[str, Any]:
    pipe = ((status.get("runtime") or {}).get("perf") or {}).get("pipe") or {}
    inbound = pipe.get("inbound") or {}
    outbound = pipe.get("outbound") or {}
    largest_dir = "inbound" if int(inbound.get("maxBytes") or 0) >= int(outbound.get("maxBytes") or 0) \
        else "outbound"
    triggers: dict[str, int] = {}
    summarizers: dict[str, int] = {}
    for record in tracker.compactions:
        triggers[str(record.get("trigger"))] = triggers.get(str(record.get("trigger")), 0) + 1
        summarizers[str(record.get("summarizer"))] = summarizers.get(str(record.get("summarizer")), 0) + 1
    refs = tracker.sidecar_refs()
    sidecars_status = status.get("sidecars") if isinstance(status.get("sidecars"), dict) else None
    sidecars: dict[str, Any] = {
        "seenInEvents": sum(1 for r in refs if not r.truncated),
        "truncatedInEvents": sum(1 for r in refs if r.truncated),
        "bytesInEvents": sum(r.bytes for r in refs if not r.truncated),
    }
    if sidecars_status is not None:
        for key in ("count", "bytes", "bytesKeptOffWire", "fallbacks"):
            sidecars[key] = sidecars_status.get(key)
    large = status.get("largeFrames") or {}
    error = tracker.error
    return {
        "mode": "naive" if naive else "gate",
        "profile": DEMO_PROFILE,
        "stopReason": tracker.stop_reason if error is None else "failed",
        "iterations": tracker.iterations,
        "maxIterations": tracker.progress.get("maxIterations"),
        "compactions": {"count": len(tracker.compactions), "triggers": triggers, "summarizers": summarizers,
                        "reactive": sum(1 for r in tracker.compactions if r.get("reactive")),
                        "summarizerErrors": tracker.summarizer_errors()},
        "largestBodyBytes": tracker.max_body_bytes,
        "engineCeilingBytes": _ceiling(status, "HOPLINE_TRANSPORT_MAX_BODY_BYTES")
        or tracker.ceiling_bytes or budget.transport_max_body_bytes,
        "gatewayLimitBytes": _ceiling(status, "API_JSON_BODY_LIMIT"),
        "largestPipeFrame": {"bytes": int(max(int(inbound.get("maxBytes") or 0),
                                               int(outbound.get("maxBytes") or 0))),
                             "direction": largest_dir},
        "pipe": {"inbound": inbound, "outbound": outbound},
        "largeFrames": {"logged": large.get("logged", 0), "suppressed": large.get("suppressed", 0)},
        "framesDropped": status.get("framesDropped", 0),
        "sidecars": sidecars,
        "gatewayResponses": statuses,
        "gateway413s": statuses.get("413", 0),
        "toolCalls": len(tracker.tool_calls),
        "sseEvents": tracker.events_seen,
        "turnError": error,
        "elapsedSeconds": round(elapsed, 2),
    }


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    from rich.table import Table

    from hopline.cli.status import exact_size as size

    table = Table(title=f"hopline demo — {summary['mode']} run, profile {summary['profile']}",
                  title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("stop reason", str(summary["stopReason"]))
    table.add_row("iterations", f"{summary['iterations']} / {summary['maxIterations']}")
    comp = summary["compactions"]
    triggers = ", ".join(f"{k}: {v}" for k, v in sorted(comp["triggers"].items())) or "none"
    summarizers = ", ".join(f"{k}: {v}" for k, v in sorted(comp["summarizers"].items()))
    table.add_row("compactions", f"{comp['count']} (triggers {triggers}"
                  + (f"; summarizer {summarizers})" if summarizers else ")"))
    errors = comp.get("summarizerErrors") or []
    if errors:  # a degraded run says so: the model's summary failed, the extractive one was used
        causes = sorted({f"origin {e.get('origin')}, status {e.get('status')}" for e in errors})
        table.add_row("  summarizer failures", f"[bold yellow]{len(errors)}[/] ({'; '.join(causes)})")
    table.add_row("largest llm-turn body", size(summary["largestBodyBytes"]))
    table.add_row("  engine ceiling", size(summary["engineCeilingBytes"]))
    table.add_row("  gateway limit", size(summary["gatewayLimitBytes"]))
    frame = summary["largestPipeFrame"]
    table.add_row("largest pipe frame", f"{size(frame['bytes'])} {frame['direction']}")
    large = summary["largeFrames"]
    table.add_row("large-frame records", f"{large['logged']} logged, {large['suppressed']} suppressed")
    table.add_row("frames dropped", str(summary["framesDropped"]))
    sc = summary["sidecars"]
    if "count" in sc:
        fallbacks = sc.get("fallbacks")
        if isinstance(fallbacks, dict):
            fallbacks = ", ".join(f"{k} {v}" for k, v in fallbacks.items() if v) or "0"
        table.add_row("sidecars (store)", f"{sc.get('count')} objects, {size(sc.get('bytes'))}; "
                      f"fallbacks {fallbacks}")
        table.add_row("  kept off the wire", f"{size(sc.get('bytesKeptOffWire'))} "
                      f"({sc['seenInEvents']} tool outputs in this turn)")
    else:
        table.add_row("sidecars (from events)", f"{sc['seenInEvents']} ({size(sc['bytesInEvents'])} kept off "
                      f"the wire), {sc['truncatedInEvents']} truncated")
    table.add_row("tool calls / SSE events", f"{summary['toolCalls']} / {summary['sseEvents']}")
    responses = sorted(summary["gatewayResponses"].items())
    table.add_row("gateway responses", ", ".join(f"{k}: {v}" for k, v in responses) or "-")
    style = "bold green" if summary["gateway413s"] == 0 else "bold red"
    table.add_row("413s", f"[{style}]{summary['gateway413s']}[/]")
    error = summary["turnError"]
    if error is not None:
        table.add_row("turn error", f"[bold red]origin {error.get('origin')}[/], "
                      f"hop {error.get('hop', '-')}, body {size(error.get('observedBytes'))}, "
                      f"limit {size(error.get('limitBytes'))}")
        table.add_row("  message", str(error.get("message", ""))[:300])
    table.add_row("elapsed", f"{summary['elapsedSeconds']} s")
    console.print(table)


async def run_demo(budget: Budget, *, naive: bool, as_json: bool, workspace: Path | None,
                   max_iterations: int) -> tuple[int, dict[str, Any]]:
    from rich.console import Console

    from hopline.cli.run import LiveView, drive_turn
    from hopline.client import DaemonClient
    from hopline.embedded import embedded_stack
    from hopline.harness.sample_workspace import make_sample_workspace

    console = Console(stderr=as_json, highlight=False, quiet=as_json)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hopline-demo-") as tmp:
        root = workspace or make_sample_workspace(Path(tmp) / "workspace")
        mode = "naive (seed's rules: gateway limit 100kb, content-only estimate)" if naive else "gate"
        console.print(f"[bold]hopline demo[/] — {mode}; sample workspace with large test logs; "
                      "starting the embedded stack…")
        async with embedded_stack(env=naive_env() if naive else None) as stack, \
                DaemonClient(stack.url, stack.token, budget=budget) as client:
            session_id = await client.create_session(cwd=str(root), profile=DEMO_PROFILE,
                                                     permission_mode="auto",
                                                     scripted=demo_hints(max_iterations))
            if as_json:
                async def silent(event: Event, tracker: TurnTracker, changed: ToolCallView | None) -> None:
                    return None

                tracker = await drive_turn(client, session_id, DEMO_PROMPT, on_event=silent)
            else:
                with LiveView(console, tool_filter=DemoToolFilter()) as view:
                    async def live(event: Event, tracker: TurnTracker, changed: ToolCallView | None) -> None:
                        if event.type == "progress":  # once per iteration: the daemon's pipe numbers
                            view.extra = frames_line(await client.status())
                        await view.on_event(event, tracker, changed)

                    tracker = await drive_turn(client, session_id, DEMO_PROMPT, on_event=live)
            status = await client.status()
            statuses = gateway_statuses(await client.metrics())
    summary = build_summary(naive=naive, tracker=tracker, status=status, statuses=statuses, budget=budget,
                            elapsed=time.monotonic() - started)
    return _exit_code(naive, summary), summary


def frames_line(status: dict[str, Any]) -> str:
    """The daemon's side of the live line: largest pipe frame, large-frame records, sidecars."""
    from hopline.budget import format_size

    pipe = ((status.get("runtime") or {}).get("perf") or {}).get("pipe") or {}
    largest = max(int((pipe.get(d) or {}).get("maxBytes") or 0) for d in ("inbound", "outbound"))
    large = status.get("largeFrames") or {}
    return f"largest frame {format_size(largest)} │ large frames {large.get('logged', 0)}"


class DemoToolFilter:
    """The demo prints the tool calls worth seeing: failures, and the first few outputs that went to a
    sidecar (with their size and preview); the rest are counted on the live line."""

    def __init__(self, shown_sidecars: int = 4) -> None:
        self.left = shown_sidecars

    def __call__(self, view: ToolCallView) -> bool:
        if view.status == "failed":
            return True
        if view.sidecars and self.left > 0:
            self.left -= 1
            return True
        return False


def _exit_code(naive: bool, summary: dict[str, Any]) -> int:
    error = summary["turnError"]
    if naive:
        reproduced = error is not None and error.get("origin") == "code"
        return 1 if reproduced else 2
    ok = error is None and summary["gateway413s"] == 0 and summary["stopReason"] in ("end_turn",
                                                                                      "max_iterations")
    return 0 if ok else 1


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        naive: bool = typer.Option(False, "--naive", help="Replay the seed's incident (100kb gateway limit, "
                                   "content-only estimate): ends with a 413 of origin code."),
        as_json: bool = typer.Option(False, "--json", help="Print only the summary, as one JSON object."),
        workspace: str = typer.Option(None, "--workspace", help="Use this directory instead of a generated "
                                      "sample workspace."),
    ) -> None:
        """Run a 60-iteration gate session over a sample workspace and summarize every hop's budget."""
        import asyncio

        import orjson
        from rich.console import Console

        from hopline.client import DaemonError, SseEventTooLarge, SseReconnectExhausted
        from hopline.embedded import EmbeddedStackError

        budget = budget_or_exit()
        try:
            code, summary = asyncio.run(run_demo(
                budget, naive=naive, as_json=as_json,
                workspace=Path(workspace).resolve() if workspace else None,
                max_iterations=budget.gate_max_iterations))
        except (DaemonError, SseEventTooLarge, SseReconnectExhausted, EmbeddedStackError) as exc:
            print(f"hopline demo: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        if as_json:
            typer.echo(orjson.dumps(summary).decode())
        else:
            console = Console(highlight=False)
            print_summary(console, summary)
            if naive and code == 1:
                console.print("[bold red]reproduced the seed's incident:[/] the gateway refused the "
                              "body with 413; origin [bold]code[/] (our side built a request the "
                              "transport refused), not model.")
            elif naive:
                console.print("[yellow]the naive run did not end with a code-origin failure[/]")
        raise typer.Exit(code)
