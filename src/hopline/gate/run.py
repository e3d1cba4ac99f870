"""One gate run (SPEC K-1): four gate agents review ``base..head`` on a read-only head checkout while
the dev session, when one is attached, waits in ``awaiting_gate``.

The run drives daemon sessions through :class:`SessionDriver` (create, prompt, events, cancel, delete,
publish), a protocol of its own: the daemon implements it over its session manager and event bus, so
this module never imports the daemon. What happens is published as events on the run's own stream
(``gate_started``, ``gate_round``, ``gate_item``, ``gate_progress``, ``gate_verdict``, ``dev_state``,
``gate_complete``), journaled like a session's.

Per gate agent and round: one session (profile = the agent, ``_meta["hopline.review"]`` = the commits),
started when a slot is free (``HOPLINE_GATE_CONCURRENCY``, daemon-wide). Its item follows its events:
``gate_running``, ``gate_compacting`` from a compaction to the next iteration, ``gate_retrying`` while
the loop retries a transient model-origin failure; no event for ``HOPLINE_GATE_STALL_SECONDS`` is
``gate_stalled``. An attempt that ends without a verdict (stalled, the turn failed, the agent exited)
is retried once on a fresh session (``gate_retrying``), then it is ``gate_error``. A final answer with
no valid verdict is asked for once more in the same session, then it is ``gate_error``: never a pass.

Before any agent: an empty range is "nothing to review" (exit 0, no agent, no checkout); with no
sandbox that runs here the run fails unless the operator allowed unsandboxed runs; the test command
(:mod:`hopline.gate.testcmd`) and the interpreter that runs it (:mod:`hopline.gate.interpreter`) are
chosen and travel to the gate sessions in their review meta.

With ``fix`` and a ``fail`` verdict while rounds remain, the dev agent (a session on the checkout,
``dev`` profile) gets one prompt with the findings; what it writes becomes a commit (the new head)
only once :mod:`hopline.gate.verify` found that it builds and keeps the base's passing tests, and
the gate runs again; else the round records ``fix_failed`` and the run ends. The checkout is removed
at the end, whatever the end (verdicts, an error, a cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from hopline.budget import Budget
from hopline.client.events import Event
from hopline.client.turn import TurnTracker
from hopline.errors import RepoError
from hopline.gate import interpreter, testcmd
from hopline.gate.driver import SessionDriver, Stalled, follow_turn
from hopline.gate.prompts import fix_prompt, gate_prompt, verdict_retry_prompt
from hopline.gate.report import AgentReport, command_ran, track
from hopline.gate.states import (
    RUN_IN_PROGRESS,
    TERMINAL_TYPES,
    VERDICT_ITEMS,
    DevEvent,
    DevState,
    DevStateMachine,
    GateItem,
    RunState,
    move_run,
)
from hopline.gate.verdict import ParsedVerdict, VerdictInvalid, error_verdict, parse_verdict
from hopline.gate.verify import FixVerifier, verified_commit
from hopline.harness.git import Checkout, changes_nothing, resolve_range
from hopline.harness.sandbox import Sandbox, detect_sandbox
from hopline.vocabulary import (
    DEV_STATE,
    GATE_AGENTS,
    GATE_COMPLETE,
    GATE_FIX,
    GATE_ITEM,
    GATE_ROUND,
    GATE_STARTED,
    GATE_VERDICT,
)

log = logging.getLogger("hopline.gate")

DEFAULT_ROUNDS = 2
DEV_PROFILE = "dev"
RUN_FILE = "run.json"  # in the run's work directory: what a restarted daemon needs to clean up
CHECKOUT_DIR = "checkout"
SECRETS_DIR = "secrets"  # detect-secrets' results per file, shared by the run's sessions (secrets_cache)
NOTHING_TO_REVIEW = "nothing to review: base and head hold the same tree"


@dataclasses.dataclass(frozen=True)
class GateRequest:
    repo: Path
    base: str | None = None
    head: str | None = None
    agents: tuple[str, ...] = GATE_AGENTS
    dev_session_id: str | None = None
    fix: bool = False
    rounds: int = DEFAULT_ROUNDS
    scripted: dict[str, Any] | None = None
    test_command: str | None = None  # --test-cmd: else the base's .hopline/gate.toml, else detected
    allow_unsandboxed: bool = False  # run the PR's code with no sandbox when none runs here
    python: str | None = None  # --python: else the base's .hopline/gate.toml, a .venv/, hopline's own


@dataclasses.dataclass(frozen=True)
class _NoVerdict:
    reason: str
    error: dict[str, Any] | None = None
    retry: bool = True  # a fresh attempt may help (a stall, a failed turn); not after a bad answer


# What a failed turn's error says that a report keeps (sizes and origins, never a message's payload).
_ERROR_KEYS = ("origin", "status", "hop", "setting", "limit", "observed", "unit", "reason", "exitCode")


class GateRun:
    """One run; :meth:`run` drives it to its end and never raises (its end is in :meth:`to_json`)."""

    def __init__(self, request: GateRequest, driver: SessionDriver, budget: Budget, *, work_dir: Path,
                 slots: asyncio.Semaphore, gate_id: str | None = None) -> None:
        self.id = gate_id or "g_" + secrets.token_hex(12)
        self.request = request
        self.driver = driver
        self.budget = budget
        self.work_dir = work_dir / self.id
        self.slots = slots
        self._state = RunState.STARTING  # moves through RUN_TRANSITIONS only (see :meth:`move`)
        self.error: str | None = None
        self.repo = request.repo
        self.base = ""
        self.head = ""
        self.base_from = ""
        self.heads: list[str] = []  # the head of each round (a fix makes a new one)
        self.rounds: list[list[AgentReport]] = []
        self.dev: DevStateMachine | None = None
        self.dev_session_id = request.dev_session_id
        self.dev_created = False
        self.dev_turns: list[dict[str, Any]] = []
        self.created_at = time.time()
        self.ended_at: float | None = None
        self.sandbox: Sandbox | None = None
        self.test_command: testcmd.TestCommand | None = None
        self.interpreter = interpreter.HOPLINE_OWN
        self.nothing_to_review = False
        self._verifier: FixVerifier | None = None
        self._checkout: Checkout | None = None
        self._creating: asyncio.Future[Checkout] | None = None
        self._cursors: dict[str, int] = {}  # last event id seen, per session
        self._task: asyncio.Task[None] | None = None

    # --- what it publishes -----------------------------------------------------------------------

    def _emit(self, event_type: str, data: dict[str, Any]) -> None:
        self.driver.publish(self.id, event_type, {"gateId": self.id, **data})

    def _set_item(self, report: AgentReport, item: GateItem, **detail: Any) -> None:
        if report.item is item and not detail:
            return
        report.item = item
        self._emit(GATE_ITEM, {"agent": report.agent, "round": report.round, "item": item.value,
                               "attempt": report.attempt, "sessionId": report.session_id, **detail})

    def _dev_fire(self, event: DevEvent, **detail: Any) -> None:
        if self.dev is None:
            return
        items = [r.item for r in self.rounds[-1]] if self.rounds else []
        change = self.dev.fire(event, items, round=len(self.rounds), **detail)
        data = {"devSessionId": self.dev_session_id, **change}
        self._emit(DEV_STATE, data)
        if self.dev_session_id is not None and self.driver.has_session(self.dev_session_id):
            self.driver.publish(self.dev_session_id, DEV_STATE, {"gateId": self.id, **data})
        log.info("dev state", extra={"state": change["state"], "previous": change["previous"]})

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def in_progress(self) -> bool:
        return self._state in RUN_IN_PROGRESS

    def move(self, target: RunState) -> None:
        """Go to ``target``, or :class:`~hopline.gate.states.IllegalRunTransition`."""
        self._state = move_run(self._state, target)

    @property
    def dev_state(self) -> str | None:
        return self.dev.state.value if self.dev is not None else None

    # --- the run ---------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.ensure_future(self.run())
        return self._task

    def cancel(self) -> bool:
        if self._task is None or self._task.done():
            return False
        self._task.cancel()
        return True

    async def wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def run(self) -> None:
        try:
            await self._prepare()
            self.move(RunState.RUNNING)
            if not self.nothing_to_review:
                await self._rounds()
            self.move(RunState.DONE)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self.move(RunState.CANCELLED)
            self.error = "cancelled"
            self._end_dev(DevEvent.CANCELLED)
        except RepoError as exc:
            self.move(RunState.FAILED)
            self.error = str(exc)
            self._end_dev(DevEvent.CANCELLED)
        except Exception as exc:  # a bug or a daemon failure: the run ends, said, never a pass
            self.move(RunState.FAILED)
            self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.warning("gate run failed", extra={"exception": type(exc).__name__})
            self._end_dev(DevEvent.CANCELLED)
        finally:
            await asyncio.shield(self._cleanup())
            self.ended_at = time.time()
            self._emit(GATE_COMPLETE, {"result": self.to_json()})
            log.info("gate run ended", extra={"state": self.state.value, "exitCode": self.exit_code})

    def _end_dev(self, event: DevEvent) -> None:
        if self.dev is not None and self.dev.state is not DevState.IDLE:
            with contextlib.suppress(Exception):
                self._dev_fire(event)

    def resolve(self) -> None:
        """The repository's root and the commits under review (blocking; :class:`RepoError` names
        what is wrong). :meth:`run` calls it unless it was called before (the daemon does, so a bad
        revision is the client's 422, not a failed run)."""
        ask = self.request
        found = resolve_range(ask.repo, ask.base, ask.head, self.budget)
        self.repo, self.base, self.head, self.base_from = found

    async def _prepare(self) -> None:
        request, budget = self.request, self.budget
        if not self.head:
            await asyncio.to_thread(self.resolve)
        repo = self.repo
        if await asyncio.to_thread(changes_nothing, repo, budget, self.base, self.head):
            self.nothing_to_review = True  # no agent starts, no checkout is made
            self._emit(GATE_STARTED, {"base": self.base, "baseFrom": self.base_from, "head": self.head,
                                      "agents": [], "nothingToReview": NOTHING_TO_REVIEW})
            return
        self.sandbox = await asyncio.to_thread(detect_sandbox)
        if not self.sandbox.available and not request.allow_unsandboxed:
            raise RepoError(f"the pull request's code runs only in a sandbox, and none runs here "
                            f"({self.sandbox.detail}); pass --allow-unsandboxed to run it anyway")
        if request.dev_session_id is not None:
            if not self.driver.has_session(request.dev_session_id):
                raise RepoError("devSessionId names no session of this daemon")
            self.dev = DevStateMachine()
        self.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the checkout's parent: 0700
        (self.work_dir / RUN_FILE).write_text(json.dumps({"repo": str(repo)}))
        (self.work_dir / SECRETS_DIR).mkdir(mode=0o700, exist_ok=True)
        # Made in a thread that a cancel cannot stop: the cleanup waits for it, then removes it.
        self._creating = asyncio.ensure_future(asyncio.to_thread(
            Checkout.create, repo, self.work_dir / CHECKOUT_DIR, self.head, budget))
        self._checkout = await asyncio.shield(self._creating)
        try:
            self.test_command = await asyncio.to_thread(testcmd.choose, request.test_command, repo, self.base,
                                                        self._checkout.path, budget)
            self.interpreter = await asyncio.to_thread(interpreter.chosen, request.python, repo, self.base,
                                                       budget, self.work_dir.parent.parent, self.sandbox.kind)
        except testcmd.TestCommandError as exc:
            raise RepoError(str(exc)) from None
        if request.fix:
            self.dev_session_id = await self.driver.create_session(
                cwd=str(self._checkout.path), profile=DEV_PROFILE, scripted=request.scripted,
                review={**self.review_meta(self.head), "fix": True})  # its commands: in the sandbox
            self.dev_created = True
            self.dev = DevStateMachine()
        self._emit(GATE_STARTED, {"base": self.base, "baseFrom": self.base_from, "head": self.head,
                                  "agents": list(request.agents), "rounds": request.rounds,
                                  "fix": request.fix, "devSessionId": self.dev_session_id,
                                  "sandbox": self.sandbox.to_json(), "python": self.interpreter.to_json(),
                                  "testCommand": self.test_command.to_json() if self.test_command else None})

    @property
    def sandbox_kind(self) -> str:
        """What a gate session runs PR code in: the sandbox, or ``none`` when the operator allowed it."""
        return self.sandbox.kind if self.sandbox is not None else "none"

    def review_meta(self, head: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"base": self.base, "head": head, "sandbox": self.sandbox_kind,
                                "cache": str((self.work_dir / SECRETS_DIR).absolute())}
        if self.test_command is not None:
            meta["testCommand"] = list(self.test_command.argv)
        if self.interpreter.path is not None:
            meta["python"] = self.interpreter.path
        return meta

    async def _rounds(self) -> None:
        head = self.head
        for number in range(1, self.request.rounds + 1):
            reports = [AgentReport(agent, number) for agent in self.request.agents]
            self.rounds.append(reports)
            self.heads.append(head)
            self._emit(GATE_ROUND, {"round": number, "head": head,
                                    "items": {r.agent: r.item.value for r in reports}})
            for report in reports:
                self._set_item(report, GateItem.QUEUED, reason="round started")
            if self.dev is not None and self.dev.state is DevState.IDLE:  # a fix round is awaited already
                self._dev_fire(DevEvent.GATE_STARTED)
            async with asyncio.TaskGroup() as group:
                for report in reports:
                    group.create_task(self._review(report, head))
            failed = [f for r in reports if r.verdict == "fail" for f in r.findings]
            if not (self.request.fix and failed and number < self.request.rounds):
                self._dev_fire(DevEvent.GATES_SETTLED)
                return
            self._dev_fire(DevEvent.FIX_STARTED)
            new_head = await self._fix(number, head, [{"agent": r.agent, **f} for r in reports
                                                if r.verdict == "fail" for f in r.findings])
            if new_head is None:
                return
            head = new_head

    # --- one gate agent ----------------------------------------------------------------------------

    async def _review(self, report: AgentReport, head: str) -> None:
        async with self.slots:
            report.started_at = time.time()
            outcome: ParsedVerdict | _NoVerdict = _NoVerdict("not run")
            for attempt in (1, 2):
                report.attempt = attempt
                outcome = await self._attempt(report, head)
                if isinstance(outcome, ParsedVerdict) or not outcome.retry or attempt == 2:
                    break
                self._set_item(report, GateItem.RETRYING, reason=outcome.reason)
            if isinstance(outcome, _NoVerdict):
                report.error = outcome.error or {"reason": outcome.reason}
                outcome = error_verdict(f"no verdict after {report.attempt} attempt(s): {outcome.reason}",
                                        self.budget)
            report.verdict = outcome.verdict
            report.summary = outcome.summary
            report.findings = outcome.findings
            report.omitted_findings, report.analyzers = outcome.omitted_findings, outcome.analyzers
            report.ended_at = time.time()
            self._set_item(report, VERDICT_ITEMS[outcome.verdict])
            self._emit(GATE_VERDICT, report.to_json())
            log.info("gate verdict", extra={"agent": report.agent, "verdict": outcome.verdict,
                                            "findings": len(outcome.findings)})

    async def _attempt(self, report: AgentReport, head: str) -> ParsedVerdict | _NoVerdict:
        assert self._checkout is not None
        session_id = await self.driver.create_session(
            cwd=str(self._checkout.path), profile=report.agent, scripted=self.request.scripted,
            review=self.review_meta(head))
        report.session_id = session_id
        self._cursors[session_id] = 0
        self._set_item(report, GateItem.RUNNING)
        stalled = False
        try:
            text = gate_prompt(report.agent, self.base, head,
                               self.test_command.to_json() if self.test_command else None)
            for ask in (1, 2):
                report.verdict_asks += 1
                try:
                    tracker = await self._follow(session_id, text, report)
                except Stalled:
                    stalled = True
                    report.stalls += 1
                    self._set_item(report, GateItem.STALLED,
                                   reason=f"no event for {self.budget.gate_stall_seconds} s")
                    return _NoVerdict(f"stalled: no event for {self.budget.gate_stall_seconds} s "
                                      "(HOPLINE_GATE_STALL_SECONDS)")
                if tracker.error is not None:
                    failed = tracker.error
                    error: dict[str, Any] = {k: failed.get(k) for k in _ERROR_KEYS if k in failed}
                    if error.get("status") == 413:
                        report.http_413s += 1
                    return _NoVerdict(f"the turn failed (origin {error.get('origin')})", error,
                                      retry=not failed.get("retryable"))  # the turn's loop retried those
                try:  # linear, bounded by the budget, and off the loop: an answer may be megabytes
                    return await asyncio.to_thread(parse_verdict, tracker.final_text, self.budget)
                except VerdictInvalid as exc:
                    if ask == 2:
                        return _NoVerdict(f"no valid verdict, asked twice: {exc}", retry=False)
                    text = verdict_retry_prompt(report.agent, self.base, head, str(exc))
            return _NoVerdict("no verdict")  # pragma: no cover - the loop returns
        finally:
            with contextlib.suppress(Exception):
                if stalled:
                    await self.driver.cancel(session_id)
            with contextlib.suppress(Exception):
                await self.driver.delete(session_id)
            self._cursors.pop(session_id, None)

    async def _follow(self, session_id: str, text: str, report: AgentReport | None,
                      commands: list[dict[str, Any]] | None = None) -> TurnTracker:
        """Prompt the session and fold its events until that turn ends (:func:`follow_turn`): a gate's
        ``report`` follows its item, ``commands`` gets how each command of the turn ran."""
        def on_event(event: Event) -> None:
            if report is not None:
                track(report, event, self._set_item, self._emit)
            if commands is not None and (ran := command_ran(event)) is not None:
                commands.append(ran)

        return await follow_turn(self.driver, session_id, text, self.budget, self._cursors, on_event)

    # --- the dev agent -----------------------------------------------------------------------------

    async def _fix(self, round_number: int, head: str, findings: list[dict[str, Any]]) -> str | None:
        """The dev agent's turn on the findings; the new head, or None when there is no new round."""
        assert self._checkout is not None and self.dev_session_id is not None
        checkout = self._checkout
        await asyncio.to_thread(checkout.writable)
        turn: dict[str, Any] = {"round": round_number, "findings": len(findings)}
        try:
            test = self.test_command.to_json() if self.test_command else None
            tracker = await self._follow(self.dev_session_id, fix_prompt(round_number, findings, test), None,
                                         turn.setdefault("commands", []))
            turn["stopReason"] = tracker.stop_reason
            if tracker.error is not None:
                turn["error"] = {k: tracker.error.get(k) for k in ("origin", "status", "hop")}
        except Stalled:
            turn["error"] = {"reason": f"stalled: no event for {self.budget.gate_stall_seconds} s"}
            with contextlib.suppress(Exception):
                await self.driver.cancel(self.dev_session_id)
        finally:
            await asyncio.to_thread(checkout.read_only)
        if self._verifier is None:
            self._verifier = FixVerifier(checkout.path, self.base, head, self.budget, self.sandbox_kind,
                                         self.test_command, self.interpreter.path)
        new_head = await verified_commit(checkout, self._verifier, self.base, round_number, turn)
        self.dev_turns.append(turn)
        self._emit(GATE_FIX, turn)
        if new_head is None:
            self._dev_fire(DevEvent.FIX_FAILED, reason=turn["reason"])
            return None
        self._dev_fire(DevEvent.FIX_DONE, commit=new_head)
        return new_head

    async def _cleanup(self) -> None:
        if self._verifier is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._verifier.close)
        if self.dev_created and self.dev_session_id is not None:
            with contextlib.suppress(Exception):
                await self.driver.delete(self.dev_session_id)
        if self._creating is not None:
            with contextlib.suppress(BaseException):
                await self._creating  # a checkout still being made is removed once it is there
            checkout = Checkout(self.repo, self.work_dir / CHECKOUT_DIR, self.budget)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(checkout.remove)
        await asyncio.to_thread(shutil.rmtree, self.work_dir, True)

    # --- the result ----------------------------------------------------------------------------------

    @property
    def agents(self) -> list[AgentReport]:
        """The last round's reports: the verdicts that count."""
        return self.rounds[-1] if self.rounds else []

    @property
    def exit_code(self) -> int | None:
        """0: every gate passed; 1: a gate failed; 2: a gate error, or the run did not finish."""
        if self.in_progress:
            return None
        if self.nothing_to_review and self.state is RunState.DONE:
            return 0
        verdicts = [r.verdict for r in self.agents]
        if self.state is not RunState.DONE or not verdicts or any(v not in ("pass", "fail")
                                                                  for v in verdicts):
            return 2
        return 1 if "fail" in verdicts else 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gateId": self.id, "state": self.state.value, "error": self.error, "exitCode": self.exit_code,
            "base": self.base, "baseFrom": self.base_from, "head": self.head,
            "finalHead": self.heads[-1] if self.heads else self.head,
            "fix": self.request.fix, "rounds": self.request.rounds, "roundsRun": len(self.rounds),
            "agents": [r.to_json() for r in self.agents],
            "history": [{"round": i + 1, "head": self.heads[i], "agents": [r.to_json() for r in reports]}
                        for i, reports in enumerate(self.rounds[:-1])],
            "pending": sorted(r.agent for r in self.agents if r.item not in TERMINAL_TYPES),
            "createdAt": self.created_at, "endedAt": self.ended_at,
            "nothingToReview": NOTHING_TO_REVIEW if self.nothing_to_review else None,
            "sandbox": self.sandbox.to_json() if self.sandbox is not None else None,
            "testCommand": self.test_command.to_json() if self.test_command is not None else None,
            "python": self.interpreter.to_json(),
        }
        if self.dev is not None:
            out.update(devSessionId=self.dev_session_id, devState=self.dev.state.value,
                       devStates=list(self.dev.history), devTurns=list(self.dev_turns))
        return out
