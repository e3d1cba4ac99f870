"""`hopline simulate`: the real tool loop, in-process, with the scripted model over a generated
workspace; one row per iteration (body bytes, estimate against the effective window, compactions).

``--naive`` replays the whole of the original incident, as ``hopline demo --naive`` does (K-5): its
rules (content-only estimate, window = context_window, no transport bound) against the gateway's
implicit ``100kb`` limit, so it fails with a 413 of origin ``code`` on the default budget. The exit
status is non-zero when the turn failed. Each row says which estimate decided (``usage``: the
scripted model's reported prompt tokens plus what was added since; ``content``: the replayed incident's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import typer

from hopline.cli._common import NAIVE_GATEWAY_LIMIT, budget_or_exit


async def simulate_run(*, budget: Any, profile_name: str, iterations: int, tool_bytes: int,
                       tools_per_iteration: int, context_window: int | None, naive: bool,
                       write_bytes: int | None, seed: int = 0) -> dict[str, Any]:
    """Run one simulated turn; the JSON document ``--json`` prints."""
    import tempfile
    from pathlib import Path

    from hopline.harness.context import orphan_tool_messages
    from hopline.harness.loop import ToolLoop
    from hopline.harness.model import EncodedRequest, LlmTurnResponse
    from hopline.harness.profiles import get_profile
    from hopline.harness.sizing import BUDGETED
    from hopline.scripted.model import InProcessModel, ScriptedModel
    from hopline.scripted.naive import NAIVE
    from hopline.scripted.sample_workspace import make_sample_workspace

    profile = get_profile(profile_name, budget).replace(max_iterations=iterations)
    if context_window is not None:  # the model's window, like HOPLINE_MODEL_CONTEXT_WINDOW (and over it)
        budget = budget.replace(model_context_window_tokens=context_window)
    if write_bytes is None:
        write_bytes = 32 * 1024 if "write_file" in profile.tools else 0
    scripted = ScriptedModel(seed=seed, tools_per_iteration=tools_per_iteration,
                             iterations=max(0, iterations - 1), write_bytes=write_bytes,
                             summary_max_bytes=budget.summary_max_bytes)

    class CheckedModel(InProcessModel):
        """The embedded gateway's view: refuses bodies over its JSON limit, counts orphans."""

        orphans = 0

        async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
            if encoded.request.purpose == "turn":
                self.orphans += orphan_tool_messages(encoded.request.messages)
            return await super().complete(encoded)

    from hopline.budget import parse_size

    gateway_limit = parse_size(NAIVE_GATEWAY_LIMIT) if naive else budget.api_json_body_limit
    model = CheckedModel(scripted, max_body_bytes=gateway_limit)
    rows: dict[int, dict[str, Any]] = {}
    sink = _row_sink(rows)

    with tempfile.TemporaryDirectory(prefix="hopline-simulate-") as tmp:
        workspace = make_sample_workspace(Path(tmp), file_bytes=tool_bytes, seed=seed)
        loop = ToolLoop(model, profile, workspace, budget, sink=sink, sizing=NAIVE if naive else BUDGETED)
        try:
            result = await loop.run([], "Review the change in this workspace and report what you find.")
        finally:
            loop.close()
    return {
        "iterations": [rows[k] for k in sorted(rows)],
        "summary": {
            "profile": profile.name,
            "naive": naive,
            "maxBodyBytes": result.max_body_bytes,
            "ceilingBytes": budget.transport_max_body_bytes,
            "gatewayLimitBytes": gateway_limit,
            "compactions": len(result.compactions),
            "orphanToolMessages": model.orphans,
            "stopReason": result.stop_reason,
            "failures": _failures_of(result),
            "repairs": result.repairs.to_json(),
        },
    }


def _row_sink(rows: dict[int, dict[str, Any]]) -> Callable[[Any], Awaitable[None]]:
    """The loop's sink: one row per iteration in ``rows``, its largest body and estimate, and the
    compaction that ran in it (an iteration reports progress before each llm-turn)."""
    from hopline.harness.loop_events import IterationProgress, LoopEvent

    async def sink(event: LoopEvent) -> None:
        if isinstance(event, IterationProgress):
            row = rows.setdefault(event.iteration, {
                "iteration": event.iteration, "bodyBytes": 0, "estimateTokens": 0,
                "effectiveWindowTokens": event.effective_window_tokens, "compacted": False, "trigger": None,
                "estimateSource": event.estimate_source})
            row["bodyBytes"] = max(row["bodyBytes"], event.body_bytes)
            row["estimateTokens"] = max(row["estimateTokens"], event.estimate_tokens)
            row["estimateSource"] = event.estimate_source
            if event.trigger is not None:
                row["compacted"] = True
                row["trigger"] = event.trigger

    return sink


def _failures_of(result: Any) -> list[dict[str, Any]]:
    """The turn's summarizer failures, then its own failure (hop, status and sizes) if it failed."""
    failures: list[dict[str, Any]] = [{"origin": f.origin, "message": f.message}
                                      for f in result.summarizer_failures]
    if result.failure is not None:
        failure = result.failure
        failures.append({"hop": failure.hop, "status": failure.status, **failure.fields()})
    return failures


def _print_rows(report: dict[str, Any]) -> None:
    summary = report["summary"]
    ceiling = summary["ceilingBytes"]
    header = (f"{'iter':>4}  {'body bytes':>11}  {'of ceiling':>10}  {'estimate/window (tokens)':>26}  "
              f"{'estimate':>8}")
    typer.echo(header + "  compaction")
    for row in report["iterations"]:
        share = f"{100 * row['bodyBytes'] / ceiling:.1f}%"
        window = f"{row['estimateTokens']}/{row['effectiveWindowTokens']}"
        mark = f"compacted ({row['trigger']})" if row["compacted"] else ""
        over = "  OVER THE CEILING" if row["bodyBytes"] > ceiling else ""
        typer.echo(f"{row['iteration']:>4}  {row['bodyBytes']:>11}  {share:>10}  {window:>26}  "
                   f"{row['estimateSource']:>8}  {mark}{over}")
    typer.echo(f"stop: {summary['stopReason']}; largest body {summary['maxBodyBytes']} of {ceiling} bytes "
               f"(gateway limit {summary['gatewayLimitBytes']}); {summary['compactions']} compactions; "
               f"{summary['orphanToolMessages']} orphan tool messages")
    for failure in summary["failures"]:
        where = f", hop {failure['hop']}" if failure.get("hop") else ""
        typer.echo(f"failure (origin {failure['origin']}{where}): {failure['message']}")


def register(app: typer.Typer) -> None:
    @app.command()
    def simulate(
        profile: str = typer.Option("qa_automation", "--profile", help="Agent profile."),
        iterations: int = typer.Option(60, "--iterations", min=1, help="Iterations (llm-turns) to run."),
        tool_bytes: int = typer.Option(160 * 1024, "--tool-bytes", min=1,
                                       help="Size of the sample workspace's large files (tool outputs)."),
        tools_per_iteration: int = typer.Option(4, "--tools-per-iteration", min=1),
        context_window: int | None = typer.Option(None, "--context-window", min=1,
                                                  help="Override the profile's context window (tokens)."),
        write_bytes: int | None = typer.Option(None, "--write-bytes", min=0,
                                               help="write_file argument size (dev; default 32 KiB)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the generated workspace and model."),
        naive: bool = typer.Option(False, "--naive", help="Without hopline's budget: the text-only estimate "
                                   "and a 100kb gateway limit."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Run the tool loop in-process with the scripted model and print one row per iteration."""
        import asyncio

        import orjson

        from hopline.harness.profiles import PROFILE_NAMES

        budget = budget_or_exit()
        if profile not in PROFILE_NAMES:
            typer.echo(f"hopline: unknown profile {profile!r}; choose one of {', '.join(PROFILE_NAMES)}",
                       err=True)
            raise typer.Exit(2)
        report = asyncio.run(simulate_run(
            budget=budget, profile_name=profile, iterations=iterations, tool_bytes=tool_bytes,
            tools_per_iteration=tools_per_iteration, context_window=context_window, naive=naive,
            write_bytes=write_bytes, seed=seed))
        if as_json:
            typer.echo(orjson.dumps(report).decode())
        else:
            _print_rows(report)
        if report["summary"]["stopReason"] == "failed":
            raise typer.Exit(1)
