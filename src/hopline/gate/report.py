"""One gate agent in one round: its report (item, verdict, figures) and how a session's events fold
into it (iterations, bodies against the ceiling, compactions, 413s, retries, sidecars)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hopline.client.events import Event
from hopline.gate.states import GateItem
from hopline.vocabulary import COMPACTION, GATE_PROGRESS, PROGRESS, TURN_COMPLETE

SetItem = Callable[..., None]  # (report, item, **detail)
Emit = Callable[[str, dict[str, Any]], None]


@dataclasses.dataclass
class AgentReport:
    """One gate agent in one round: where it is, its verdict and its figures."""

    agent: str
    round: int
    item: GateItem = GateItem.QUEUED
    attempt: int = 0
    session_id: str | None = None
    verdict: str | None = None
    summary: str = ""
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    omitted_findings: int = 0
    analyzers: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # what its verdict ran
    iterations: int = 0
    max_iterations: int = 0
    compactions: int = 0
    summarizers: dict[str, int] = dataclasses.field(default_factory=dict)  # compactions by summarizer
    summarizer_errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # why extractive
    max_body_bytes: int = 0
    ceiling_bytes: int = 0
    http_413s: int = 0
    model_retries: int = 0
    stalls: int = 0
    verdict_asks: int = 0
    sidecars: int = 0  # fields of its updates moved to sidecars (kept off the wire)
    sidecar_bytes: int = 0
    test_runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # its runs of the test command
    error: dict[str, Any] | None = None
    started_at: float | None = None
    ended_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"agent": self.agent, "round": self.round, "item": self.item.value, "attempt": self.attempt,
                "sessionId": self.session_id, "verdict": self.verdict, "summary": self.summary,
                "findings": self.findings, "omittedFindings": self.omitted_findings,
                "analyzers": self.analyzers,
                "iterations": self.iterations, "maxIterations": self.max_iterations,
                "compactions": self.compactions, "summarizers": dict(self.summarizers),
                "summarizerErrors": list(self.summarizer_errors), "maxBodyBytes": self.max_body_bytes,
                "ceilingBytes": self.ceiling_bytes, "http413s": self.http_413s,
                "modelRetries": self.model_retries, "stalls": self.stalls, "verdictAsks": self.verdict_asks,
                "sidecars": self.sidecars, "sidecarBytes": self.sidecar_bytes,
                "testRuns": list(self.test_runs), "error": self.error, "startedAt": self.started_at,
                "endedAt": self.ended_at}


def track(report: AgentReport, event: Event, set_item: SetItem, emit: Emit) -> None:
    """Fold one event of a gate session into its report; its item and progress go out through
    ``set_item`` and ``emit``."""
    moved = [ref for ref in event.sidecars() if not ref.truncated]
    report.sidecars += len(moved)
    report.sidecar_bytes += sum(ref.bytes for ref in moved)
    if event.type == PROGRESS:
        progress = event.data.get("progress") or {}
        retry = progress.get("retry")
        report.iterations = max(report.iterations, int(progress.get("iteration") or 0))
        report.max_iterations = int(progress.get("maxIterations") or report.max_iterations)
        report.max_body_bytes = max(report.max_body_bytes, int(progress.get("bodyBytes") or 0))
        report.ceiling_bytes = int(progress.get("ceilingBytes") or report.ceiling_bytes)
        if isinstance(retry, dict):
            if retry.get("status") == 413:
                report.http_413s += 1
            if retry.get("origin") == "model":
                report.model_retries += 1
                set_item(report, GateItem.RETRYING, reason="a transient model failure is retried")
        else:
            set_item(report, GateItem.RUNNING)
        emit(GATE_PROGRESS, {"agent": report.agent, "round": report.round,
                                   "attempt": report.attempt, "iteration": report.iterations,
                                   "maxIterations": report.max_iterations,
                                   "bodyBytes": int(progress.get("bodyBytes") or 0),
                                   "maxBodyBytes": report.max_body_bytes,
                                   "ceilingBytes": report.ceiling_bytes,
                                   "compactions": report.compactions,
                                   "extractiveSummaries": len(report.summarizer_errors),
                                   "http413s": report.http_413s,
                                   "sidecars": report.sidecars})
    elif event.type == COMPACTION:
        record = event.data.get("compaction")
        record = record if isinstance(record, dict) else {}
        report.compactions += 1
        summarizer = str(record.get("summarizer") or "model")
        report.summarizers[summarizer] = report.summarizers.get(summarizer, 0) + 1
        failed = record.get("summarizerError")
        if isinstance(failed, dict):  # the model's summary failed: the extractive one was used
            report.summarizer_errors.append({k: failed.get(k) for k in ("origin", "status", "hop")
                                             if k in failed})
        set_item(report, GateItem.COMPACTING, trigger=record.get("trigger"))
    elif (ran := test_run(event)) is not None:
        report.test_runs.append(ran)
    elif event.type == TURN_COMPLETE:
        turn = event.data.get("turn")
        turn = turn if isinstance(turn, dict) else {}
        report.max_body_bytes = max(report.max_body_bytes, int(turn.get("maxBodyBytes") or 0))


def command_ran(event: Event) -> dict[str, Any] | None:
    """How a session's ``run_command`` ran (its ``tool_call_update``'s rawOutput: the sandbox, the
    exit code, the processes the sandbox refused), or None for any other event."""
    if event.update_kind != "tool_call_update":
        return None
    raw = event.update.get("rawOutput")
    if not isinstance(raw, dict) or "sandbox" not in raw:
        return None
    return {k: raw.get(k) for k in ("sandbox", "exitCode", "timedOut", "refusedProcesses")}


def test_run(event: Event) -> dict[str, Any] | None:
    """How a run of the gate's test command went, from its ``tool_call_update`` (what the tool
    itself read of it, never what the model says): where, the command, its exit, what it showed."""
    raw = event.update.get("rawOutput") if event.update_kind == "tool_call_update" else None
    tests = raw.get("tests") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(tests, dict):
        return None
    return {"at": raw.get("at"), "command": raw.get("command"), "coverage": bool(raw.get("coverage")),
            "exitCode": raw.get("exitCode"), "timedOut": raw.get("timedOut"),
            **{k: tests.get(k) for k in ("runner", "ran", "didNotRun", "counts", "summary")}}
