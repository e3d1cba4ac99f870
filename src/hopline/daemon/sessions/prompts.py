"""Prompts, one turn at a time per session (ACP agents run one turn at a time); a turn's end event
carries what it could not deliver (D-8). Accepted prompts are journaled until their turn ends, so
whoever finds them open later (the next start, an adoption) ends them: :func:`end_open_prompts`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_API, HOP_PIPE, Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.child import AcpChild, AgentExited, AgentNotReading, AgentRpcError, AgentUnresponsive
from hopline.daemon.content import check_capabilities
from hopline.daemon.errors import SessionError
from hopline.daemon.sessions.durable_end import end_turn_durably
from hopline.daemon.sessions.keys import KeyClaim, record_of
from hopline.daemon.sessions.ownership import Ownership
from hopline.daemon.sessions.permissions import answer_cancelled, cancel_all
from hopline.daemon.sessions.state import DaemonSession, PendingPermission, SessionState
from hopline.daemon.sessions.tasks import BackgroundTasks
from hopline.daemon.storage_faults import STORAGE_UNAVAILABLE, commit_first, is_storage_fault, refusal
from hopline.daemon.turn_end import turn_complete_of, turn_error_of
from hopline.errors import LeaseLost, StoreUnavailable
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.store_projection import StoreSink
from hopline.store.idempotency import KeyRecord
from hopline.store.journal import EventJournal
from hopline.vocabulary import CANCEL_REQUESTED, TURN_COMPLETE, TURN_ERROR

log = logging.getLogger("hopline.daemon.sessions")


async def end_open_prompts(journal: EventJournal, bus: EventBus, unended: list[tuple[str, str]], *,
                           reason: str, message: str) -> int:
    """End each (session id, prompt id) with a ``turn_error`` from the daemon, then close it (after
    its end event, in write order); a session no longer in the store is skipped. How many ended."""
    ended = 0
    for session_id, prompt_id in unended:
        if await journal.get_session(session_id) is None:  # opens it for its event
            continue
        bus.publish(session_id, TURN_ERROR, {"promptId": prompt_id, "origin": "daemon", "reason": reason,
                                             "message": message})
        await journal.close_prompt(session_id, prompt_id)
        log.warning("open prompt ended", extra={"reason": reason})
        ended += 1
    return ended


def accepting(session: DaemonSession) -> dict[str, Any]:
    """The initialize answer a prompt is checked against: the live child's; or, when the child was
    stopped for ignoring a cancel, the last one's (the prompt's turn starts a new child first)."""
    if session.restart_on_prompt and session.state is not SessionState.STARTING:
        return session.agent_init
    return require_ready(session).initialized


def require_ready(session: DaemonSession) -> AcpChild:
    child = session.child
    if child is None or not child.alive or session.state is not SessionState.READY:
        state = "loading" if session.state is SessionState.LOADING else "detached"
        message = ("the session is being loaded" if state == "loading" else
                   f"the session has no running agent (last exit code {session.exit_code}); "
                   "POST /session/{id}/load restores it")
        raise SessionError(409, "session_not_ready", message, state=state)
    return child


class Prompts:
    def __init__(self, budget: Budget, journal: EventJournal, bus: EventBus, tasks: BackgroundTasks,
                 ownership: Ownership | None = None, sidecars: SidecarStore | None = None) -> None:
        self.sidecars = sidecars
        self.budget = budget
        self.journal = journal
        self.bus = bus
        self.tasks = tasks
        self.ownership = ownership if ownership is not None else Ownership(None)
        # The manager's: detach a child that ignored a cancel and stop it (the next prompt restarts
        # the session's agent); restore the session on a new child (session/load, else session/new).
        self.retire: Callable[[DaemonSession, AcpChild], None] = _no_retire
        self.restore: Callable[[DaemonSession], Awaitable[Any]] | None = None

    async def prompt(self, session: DaemonSession, blocks: list[dict[str, Any]],
                     key: KeyClaim | None = None) -> str:
        """Accept a prompt of ACP content blocks (checked by :mod:`hopline.daemon.content` against the
        budget and the agent's promptCapabilities first); its turn runs after the turns before it.
        ``key``: the request's idempotency key, stored with the open prompt."""
        check_capabilities(blocks, accepting(session))
        pending, limit = session.pending_prompts, self.budget.max_pending_prompts
        if pending >= limit:
            setting = CEILINGS_BY_KEY["max_pending_prompts"].name
            message = (f"this would be prompt {pending + 1} running or queued in this session, over the "
                       f"limit of {limit} ({setting}); wait for a turn to end")
            raise SessionError.over_limit(429, "too_many_pending_prompts", "max_pending_prompts", limit,
                                          pending + 1, message, hop=HOP_DAEMON_API)
        prompt_id = "p_" + secrets.token_hex(8)
        # Registered at once (it counts toward the limit while the prompt is stored); the task
        # waits for open_prompt's commit before it sends anything (write-ahead, T-1): a prompt the
        # journal refused never reaches the agent, and a 202 means the prompt is durable.
        accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._run(session, prompt_id, blocks, accepted))
        session.prompts[prompt_id] = task
        task.add_done_callback(lambda _t: session.forget_prompt(prompt_id))
        record = record_of(key, session.id, 202, {"promptId": prompt_id})
        try:
            await self._open(session, prompt_id, record)  # before the 202: a restart ends it (D-8)
        except LeaseLost:  # the lease this write came under is gone (this daemon was frozen): not run
            task.cancel()
            raise await self.ownership.stale_write(session.id) from None
        except BaseException as exc:
            task.cancel()
            if isinstance(exc, Exception) and is_storage_fault(exc):
                log.error("prompt refused: the journal could not store it",
                          extra={"exception": type(exc).__name__})
                raise refusal(exc, "the prompt") from None
            raise
        accepted.set_result(None)
        return prompt_id

    async def _open(self, session: DaemonSession, prompt_id: str, key: KeyRecord | None) -> None:
        """open_prompt (with its key) under the lease; a lease that only expired (the store was away
        longer than it, and nobody took it) is renewed and the open tried once more."""
        try:
            await self.journal.open_prompt(session.id, prompt_id, key)
        except LeaseLost:
            if not await self.ownership.renew_own(session.id):
                raise
            await self.journal.open_prompt(session.id, prompt_id, key)

    def _sink(self, session: DaemonSession) -> StoreSink | None:
        return StoreSink(self.sidecars, session.id) if self.sidecars is not None else None

    async def _end_turn(self, session: DaemonSession, prompt_id: str, event_type: str,
                        data: dict[str, Any], lost_here: int = 0) -> None:
        """Publish the turn's end with the D-8 fields (the bytes it could not deliver, ``lost_here``
        of them in this very event); the prompt is then no longer open (a turn cut before this point
        is ended by the next daemon start). A turn whose events the journal refused ends with
        ``turn_error`` (origin daemon, reason storage), stored once the store takes it again
        (:func:`end_turn_durably`)."""
        lost = session.turn_lost.pop(prompt_id, 0) + lost_here
        degraded = lost > 0 or prompt_id in session.turn_degraded
        session.turn_degraded.discard(prompt_id)
        session.ended_prompts.add(prompt_id)  # its slot frees before its end is visible (queue again)
        await end_turn_durably(self.bus, self.journal, session, prompt_id,
                               (event_type, {**data, "lostBytes": lost, "degraded": degraded}))

    def journal_failed(self, session: DaemonSession) -> Awaitable[None] | None:
        """An event of the session was not stored: the prompt in flight is cut (its agent is told
        to stop: what it does next could not be recorded) and will end with a storage turn_error.
        The cancel to send, on the first refusal of the turn."""
        prompt_id = session.current_prompt
        if prompt_id is None:
            return None
        first = prompt_id not in session.storage_faults
        session.storage_faults[prompt_id] = session.storage_faults.get(prompt_id, 0) + 1
        child = session.child
        if not first or child is None or session.agent_session_id is None:
            return None
        self.cut(session, [prompt_id])  # it ends within the cancel's grace, whatever the agent does
        log.error("a turn's events could not be stored: the agent's turn is cancelled")
        return _quietly(child.notify("session/cancel", {"sessionId": session.agent_session_id}))

    async def _run(self, session: DaemonSession, prompt_id: str, blocks: list[dict[str, Any]],
                   accepted: asyncio.Future[None]) -> None:
        await accepted  # open_prompt committed (else this task is cancelled: nothing was sent)
        async with session.turn_lock:
            if prompt_id in session.cancelled_prompts:
                await self._end_cancelled(session, prompt_id, started=False)
                return
            child = session.child
            if (child is None or not child.alive) and session.restart_on_prompt:
                child = await self._restart(session, prompt_id)
                if child is None:
                    return  # its turn ended, saying why
            if child is None or not child.alive or session.agent_session_id is None:
                await self._publish_exit_error(session, prompt_id,
                                               session.child_failure or AgentExited(session.exit_code))
                return
            if not await self._still_owner(session, prompt_id):
                return  # not written to the child; the adopter ends the open prompt (owner_lost)
            if prompt_id in session.cancelled_prompts:  # cancelled while the lease was checked
                await self._end_cancelled(session, prompt_id, started=False)
                return
            session.current_prompt = prompt_id
            session.turn_lost[prompt_id] = 0
            try:
                answered, result = await self._ask(session, child, blocks)
                if not answered:  # a cancel's grace passed: the agent ignored it
                    self.retire(session, child)
                    await self._end_cancelled(session, prompt_id, started=True)
                    return
                end = await asyncio.to_thread(turn_complete_of, prompt_id, result, self.budget,
                                              self._sink(session))
                await self._end_turn(session, prompt_id, TURN_COMPLETE, end.payload, end.lost_bytes)
            except AgentRpcError as exc:
                end = await asyncio.to_thread(turn_error_of, prompt_id, exc, self.budget, self._sink(session))
                await self._end_turn(session, prompt_id, TURN_ERROR, end.payload, end.lost_bytes)
            except AgentExited as exc:
                await self._publish_exit_error(session, prompt_id, exc)
            finally:
                session.current_prompt = None

    async def _ask(self, session: DaemonSession, child: AcpChild,
                   blocks: list[dict[str, Any]]) -> tuple[bool, Any]:
        """``(True, the agent's answer)`` to session/prompt; ``(False, None)`` when a cancel's grace
        passed first (the request is given up: the agent ignored the cancel)."""
        stop = session.turn_stop = asyncio.get_running_loop().create_future()
        request = asyncio.ensure_future(child.request("session/prompt", {
            "sessionId": session.agent_session_id, "prompt": blocks}))
        try:
            await asyncio.wait((request, stop), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the turn's task cancelled (a delete, a shutdown, a lease lost)
            request.cancel()
            raise
        finally:
            session.turn_stop = None
        if request.done():
            result, _ = request.result()
            return True, result
        request.cancel()
        return False, None

    def cut(self, session: DaemonSession, prompt_ids: list[str]) -> None:
        """These prompts end within ``HOPLINE_CANCEL_GRACE_SECONDS``: a queued one as its turn comes,
        without being sent; the one in flight with the agent's own answer if it comes in time,
        else the daemon ends it and stops the agent (:meth:`_ask`)."""
        ids = frozenset(prompt_ids) - session.cancelled_prompts
        if not ids:
            return
        session.cancelled_prompts |= ids
        asyncio.get_running_loop().call_later(self.budget.cancel_grace_seconds, _grace_passed, session, ids)

    async def _end_cancelled(self, session: DaemonSession, prompt_id: str, *, started: bool) -> None:
        grace = self.budget.cancel_grace_seconds
        setting = CEILINGS_BY_KEY["cancel_grace_seconds"].name
        message = (f"the agent did not end its turn within {grace:g} s of the cancel ({setting}): the daemon "
                   "ended it and stopped the agent; the next prompt starts a new one" if started else
                   "cancelled before its turn started: it was never sent to the agent")
        await self._end_turn(session, prompt_id, TURN_COMPLETE, {
            "promptId": prompt_id, "stopReason": "cancelled", "origin": "daemon", "turn": None,
            "agentStopped": started, "graceSeconds": grace, "setting": setting, "message": message})

    async def _restart(self, session: DaemonSession, prompt_id: str) -> AcpChild | None:
        """A new child for a session whose child was stopped for ignoring a cancel; a restore that
        fails ends the prompt's turn saying why (None)."""
        assert self.restore is not None
        try:
            await self.restore(session)
        except Exception as exc:
            failure = exc if isinstance(exc, SessionError) else None
            if failure is None and not is_storage_fault(exc):
                raise
            kind = failure.body["error"]["type"] if failure is not None else STORAGE_UNAVAILABLE
            await self._end_turn(session, prompt_id, TURN_ERROR, {
                "promptId": prompt_id, "origin": "daemon", "reason": "agent_restart_failed", "error": kind,
                "message": f"the agent, stopped after it ignored a cancel, could not be started again "
                           f"({exc}); the next prompt tries again"})
            return None
        return session.child

    async def _still_owner(self, session: DaemonSession, prompt_id: str) -> bool:
        """The lease is still this daemon's just before the prompt reaches the child (exactly-once
        starts). A store that cannot tell ends the turn; a lost lease stops the session."""
        try:
            return await self.ownership.still_holds(session.id)
        except StoreUnavailable as exc:
            await self._end_turn(session, prompt_id, TURN_ERROR, {
                "promptId": prompt_id, "origin": "daemon", "reason": STORAGE_UNAVAILABLE,
                "message": f"the prompt was not started: the session's lease could not be checked ({exc})"})
            return False

    async def _publish_exit_error(self, session: DaemonSession, prompt_id: str, exc: AgentExited) -> None:
        if isinstance(exc, AgentNotReading):  # the agent did not fail, it did not read
            await self._end_turn(session, prompt_id, TURN_ERROR, _stalled(
                prompt_id, "agent_not_reading", exc.timeout, "pipe_write_timeout_seconds",
                f"the agent did not read its stdin for {exc.timeout} s"))
            return
        if isinstance(exc, AgentUnresponsive):
            await self._end_turn(session, prompt_id, TURN_ERROR, _stalled(
                prompt_id, "agent_unresponsive", exc.silence, "agent_silence_seconds",
                f"the agent wrote nothing for {exc.silence} s while a request to it was pending"))
            return
        code = exc.returncode
        await self._end_turn(session, prompt_id, TURN_ERROR, {
            "promptId": prompt_id, "origin": "agent", "reason": "agent_exited", "exitCode": code,
            "message": f"the agent process exited (code {code}) before the turn finished"})

    async def cancel(self, session: DaemonSession, key: KeyClaim | None = None) -> bool:
        """Answered at once: the writes (the pending permissions' answers, ``session/cancel``) go in
        the background, so a cancel never waits behind a write the child does not read (each has
        the write deadline). ``key``: the request's idempotency key, stored with the cancel. Every
        prompt running or queued then ends within the cancel's grace (:meth:`cut`); a session with
        prompts queued for a new child is cancelled without one."""
        live = session.child is not None and session.child.alive and session.state is SessionState.READY
        if not live and not session.pending_prompts:
            require_ready(session)  # the 409 saying why there is nothing to cancel
        # A turn whose end is stored is over, though its task has not yet let it go.
        current = session.current_prompt
        running = current is not None and current not in session.ended_prompts
        # Write-ahead (T-1): the cancel is journaled before it is answered; the writes to the child
        # then go in the background.
        record = record_of(key, session.id, 200, {"cancelled": running})
        await commit_first(self.bus, session.id, CANCEL_REQUESTED, {"promptId": current if running else None},
                           "the cancel", record)
        self.cut(session, [p for p in list(session.prompts) if p not in session.ended_prompts])
        child = session.child
        if child is not None and child.alive:
            self.tasks.spawn(self._send_cancel(session, child, cancel_all(self.bus, session)))
        return running

    async def _send_cancel(self, session: DaemonSession, child: AcpChild,
                           pending: list[PendingPermission]) -> None:
        await answer_cancelled(pending)
        if session.agent_session_id is not None:
            with contextlib.suppress(AgentExited):
                await child.notify("session/cancel", {"sessionId": session.agent_session_id})


def _stalled(prompt_id: str, reason: str, seconds: float, key: str, what: str) -> dict[str, Any]:
    """The turn_error of a turn whose child the daemon gave up on (a deadline passed)."""
    setting = CEILINGS_BY_KEY[key].name
    return {"promptId": prompt_id, "origin": "daemon", "reason": reason, "hop": HOP_PIPE,
            "timeoutSeconds": seconds, "setting": setting,
            "message": f"{what} ({setting}); the turn ended and the agent was stopped "
                       "(POST /session/{id}/load restores the session)"}


def _grace_passed(session: DaemonSession, prompt_ids: frozenset[str]) -> None:
    """A cancel's grace passed: the turn in flight, if it is one of the cut ones, stops waiting."""
    stop = session.turn_stop
    if session.current_prompt in prompt_ids and stop is not None and not stop.done():
        stop.set_result(None)


def _no_retire(_session: DaemonSession, _child: AcpChild) -> None:
    return None


async def _quietly(awaitable: Awaitable[Any]) -> None:
    with contextlib.suppress(AgentExited, OSError):
        await awaitable
