"""One ACP child process and its end of the pipe (SPEC D-2, W-2, O-1..O-3).

stdout is read in chunks through :class:`NdjsonDecoder` with the budget's explicit max frame (never
``StreamReader.readline``, whose implicit 64 KiB limit tears the pipe down on the first large
frame). Every decoded frame feeds the inbound tap (stats, histogram, large-frame observer); every
written frame feeds the outbound tap after the write. The daemon keeps its own JSON-RPC id space
toward the child; the child's request ids are echoed back verbatim in our responses.

stderr is drained without blocking and never stored or logged: only lines, bytes and over-long
lines are counted. The child's environment is built from an allow-list (SPEC D-2, D-11), see
:func:`child_environment`: no secret of the daemon reaches a child unless the operator names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import re
import signal
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

from hopline.budget import SECRET_SETTINGS_ENV, Budget, HoplineError
from hopline.budget.variables import AGENT_ENV, HOPLINE_TOKEN_ENV, NAIVE_ENV, PERMISSION_MODE_ENV
from hopline.daemon.pipe_chunks import PipeChunks, start_child
from hopline.daemon.reaper import end_tree, subreaper_preexec
from hopline.daemon.silence import SilenceDeadline
from hopline.errors import AgentError
from hopline.observe.pipe import PipeObservability
from hopline.wire.jsonrpc import message_kind
from hopline.wire.ndjson import READ_CHUNK_BYTES, Frame, FrameError, NdjsonDecoder

log = logging.getLogger("hopline.daemon.child")

# The safe base every child gets from the daemon's environment (when set): what a process needs
# to run, find its home and speak the user's locale, and nothing that authenticates anything.
SAFE_BASE_ENV: frozenset[str] = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ",
    "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
    "VIRTUAL_ENV", "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
})
SAFE_BASE_PREFIXES: tuple[str, ...] = ("LC_",)
# hopline's own non-secret settings the agent reads (the budget's variables travel via to_env()).
HOPLINE_SETTINGS_ENV: frozenset[str] = frozenset({NAIVE_ENV, PERMISSION_MODE_ENV})
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

JSONRPC_METHOD_NOT_FOUND = -32601
# I/O granularity, not a limit: while the decoder holds the start of a frame larger than one read
# chunk, the reader takes up to this much of what the stream has buffered at once (no event can
# come out before the frame ends). Small frames keep 64 KiB reads, so one read's burst of events
# stays a few per subscriber queue (a larger pipe or read made the slow-subscriber test's reader
# that keeps up fall behind).
LARGE_READ_BYTES = 256 * 1024
# I/O granularity too: after a read whose frames averaged at least this, the next read takes up to
# LARGE_READ_BYTES, which then carries at most 64 such frames, as a 64 KiB read of 1 KiB frames
# does (one journal commit, one burst per subscriber): a commit costs CPU whatever its size.
LARGE_FRAME_BYTES = LARGE_READ_BYTES // 64
# How many ids of requests given up before their answer came (a waiter cancelled, as when the
# daemon stops while a warm child's initialize is in flight, or past its deadline) are remembered:
# a late answer to one of these is expected, not a peer's error. Only the newest are kept.
ABANDONED_IDS_KEPT = 64


class AgentExited(AgentError):
    def __init__(self, returncode: int | None) -> None:
        super().__init__(f"the agent process exited with code {returncode}")
        self.returncode = returncode


class AgentNotReading(AgentExited):
    """A write to the child did not finish within ``HOPLINE_PIPE_WRITE_TIMEOUT``: the child does not
    read its stdin. Every later write fails at once with this (the child is then stopped)."""

    def __init__(self, timeout: float) -> None:
        HoplineError.__init__(self, f"the agent read none of a write to its stdin for {timeout} s "
                              "(HOPLINE_PIPE_WRITE_TIMEOUT): it is not reading")
        self.returncode = None
        self.timeout = timeout


class AgentUnresponsive(AgentExited):
    """The child wrote nothing for ``HOPLINE_AGENT_SILENCE_SECONDS`` while a request to it was
    pending (and it was not waiting for an answer of ours): it is stopped."""

    def __init__(self, silence: float) -> None:
        HoplineError.__init__(self, f"the agent wrote nothing for {silence} s while a request to it was "
                              "pending (HOPLINE_AGENT_SILENCE_SECONDS): it is unresponsive")
        self.returncode = None
        self.silence = silence


class AgentRpcError(AgentError):
    """The child answered a request with a JSON-RPC error."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        message = error.get("message")
        self.code = error.get("code")
        self.message = message if isinstance(message, str) else "agent error"
        self.data = error.get("data")
        super().__init__(self.message)


class ChildHandler(Protocol):
    # May return an awaitable (work moved off the event loop): the reader awaits it before the next
    # frame, so the order of the child's messages is kept.
    def on_notification(self, frame: Frame) -> Awaitable[None] | None: ...
    # May return an awaitable, as on_notification (a refusal written back, a projection).
    def on_request(self, frame: Frame) -> Awaitable[None] | None: ...
    def on_frame_error(self, error: FrameError | None, size: int, reason: str) -> None: ...
    def on_exit(self, returncode: int | None) -> None: ...
    # The daemon gave up on the child while it runs (a write passed its deadline: it does not read
    # its stdin; or it was silent past its deadline): its requests failed with ``failure``, and the
    # handler stops it.
    def on_stalled(self, failure: AgentExited) -> None: ...
    # Wraps the synchronous handling of the frames of one pipe read: what they publish is journaled
    # in one transaction at its end (SPEC D-5 keeps: published only after the commit).
    def batch(self) -> contextlib.AbstractContextManager[None]: ...
    # None while the child may be read on; else an awaitable done when it may (the journal's queue
    # is full, or a subscriber is catching up: the child is held back, SPEC D-4, D-5 bounds).
    def backpressure(self) -> Awaitable[Any] | None: ...


@dataclasses.dataclass
class StderrCounters:
    lines: int = 0
    bytes: int = 0
    long_lines: int = 0  # lines over child_stderr_line_max_bytes (counted, never kept)


def agent_env_names(names: Sequence[str]) -> tuple[str, ...]:
    """The variables the operator passes to children (``--agent-env``, ``HOPLINE_AGENT_ENV``:
    names, comma-separated allowed). A malformed name, or one of hopline's own tokens
    (``HOPLINE_SERVER_TOKEN``, ``HOPLINE_INTERNAL_TOKEN``, ...), raises ``ValueError``; a provider key
    may be named, for an agent that calls its provider itself."""
    out: list[str] = []
    for item in names:
        for name in (part.strip() for part in item.split(",")):
            if not name:
                continue
            if not _ENV_NAME_RE.match(name):
                raise ValueError(f"{AGENT_ENV}: {name[:64]!r} is not an environment variable name")
            if name in HOPLINE_TOKEN_ENV or name in SECRET_SETTINGS_ENV:
                raise ValueError(f"{AGENT_ENV}: {name} is a credential of hopline itself and never reaches "
                                 "a child (the agent gets a per-session credential instead)")
            if name not in out:
                out.append(name)
    return tuple(out)


def child_environment(base: Mapping[str, str], extra: Mapping[str, str],
                      named: Sequence[str] = ()) -> dict[str, str]:
    """A child's environment: the safe base and hopline's settings taken from ``base``, the
    variables the operator ``named``, then ``extra`` (what hopline itself passes). Nothing else of
    ``base`` (provider keys, tokens, the operator's other secrets) reaches the child."""
    allowed = SAFE_BASE_ENV | HOPLINE_SETTINGS_ENV | set(named)
    env = {k: v for k, v in base.items() if k in allowed or k.startswith(SAFE_BASE_PREFIXES)}
    env.update(extra)
    return env


class AcpChild:
    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], budget: Budget,
                 instruments: PipeObservability, handler: ChildHandler) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.budget = budget
        self.instruments = instruments
        self.handler = handler
        self.inbound = instruments.tap("inbound")
        self.outbound = instruments.tap("outbound")
        self.decoder = NdjsonDecoder(budget.pipe_max_frame_bytes)
        self.stderr = StderrCounters()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[Any, int]]] = {}
        self._abandoned: dict[int, bool] = {}  # ids given up, oldest first (ABANDONED_IDS_KEPT)
        self._write_lock = asyncio.Lock()
        # Why the daemon gave up on the child while it runs (AgentNotReading: a write passed its
        # deadline; AgentUnresponsive: silent past its deadline): no write is tried again.
        self.failure: AgentExited | None = None
        self.output_closed = False  # EOF on its stdout: nothing it says can arrive any more
        self.silence = SilenceDeadline(budget.agent_silence_seconds, self._owes_answer, self._silent)
        self._proc: asyncio.subprocess.Process | None = None
        self._stdout: PipeChunks | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.exited = asyncio.Event()
        self.returncode: int | None = None
        self.initialized: dict[str, Any] = {}  # its initialize answer (capabilities, _meta)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return (self._proc is not None and not self.exited.is_set() and self.failure is None
                and not self.output_closed)

    def _gone(self) -> AgentExited:
        """The error a request or a write fails with once the child is given up or exited."""
        failure = self.failure
        if isinstance(failure, AgentNotReading):
            return AgentNotReading(failure.timeout)
        if isinstance(failure, AgentUnresponsive):
            return AgentUnresponsive(failure.silence)
        return AgentExited(self.returncode)

    async def start(self) -> None:
        # The readers' limit is the largest read: stdout's chunks are taken up to a read's bytes.
        self._proc, self._stdout = await start_child(
            self.argv, env=self.env, start_new_session=True, limit=LARGE_READ_BYTES,
            preexec_fn=subreaper_preexec())
        self._tasks = [asyncio.create_task(self._read_stdout()), asyncio.create_task(self._drain_stderr())]

    # --- writing ----------------------------------------------------------------------------------

    async def _write(self, message: dict[str, Any]) -> None:
        """Write one frame; its wait for the pipe is bounded by ``HOPLINE_PIPE_WRITE_TIMEOUT``
        (a write queued behind another waits at most for that one's deadline)."""
        proc = self._proc
        if proc is None or proc.stdin is None or not self.alive:
            raise self._gone()
        timeout = self.budget.pipe_write_timeout_seconds
        # A bound method, not a closure: compiled (mypyc), a closure and its environment form a
        # cycle that would hold the message until the collector runs.
        write = functools.partial(self._write_line, proc.stdin, timeout)
        async with self._write_lock:
            if not self.alive:
                raise self._gone()
            try:
                await self.outbound.write_observed(write, message)
            except (ConnectionError, BrokenPipeError, RuntimeError) as exc:
                # RuntimeError: a write to a transport closed meanwhile (the child being stopped)
                raise AgentExited(self.returncode) from exc

    async def _write_line(self, stdin: asyncio.StreamWriter, timeout: float, line: bytes) -> None:
        stdin.write(line)
        try:
            await asyncio.wait_for(stdin.drain(), timeout)
        except TimeoutError:
            self._not_reading()
            raise AgentNotReading(timeout) from None

    def _not_reading(self) -> None:
        """A write passed its deadline: what is buffered for the child is dropped (its stdin is
        closed), every request waiting for an answer fails, and the handler stops the child."""
        if self.failure is not None:
            return
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            transport = proc.stdin.transport
            with contextlib.suppress(Exception):
                transport.abort()
        log.warning("agent not reading its stdin: write deadline passed",
                    extra={"timeoutSeconds": self.budget.pipe_write_timeout_seconds})
        self._stall(AgentNotReading(self.budget.pipe_write_timeout_seconds))

    def _stall(self, failure: AgentExited) -> None:
        """The daemon gives up on the running child: its requests fail with ``failure``, nothing is
        written to it again, and the handler stops it."""
        self.failure = failure
        self.silence.stop()
        self._fail_pending()
        try:
            self.handler.on_stalled(failure)
        except Exception:
            log.exception("stalled-child handler failed")

    def _fail_pending(self) -> None:
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(self._gone())

    def _owes_answer(self) -> bool:
        return (bool(self._pending) and self.failure is None and not self.output_closed
                and not self.exited.is_set())

    def _silent(self) -> None:
        log.warning("agent silent past its deadline while a request to it was pending: stopped",
                    extra={"silenceSeconds": self.silence.seconds, "pendingRequests": len(self._pending)})
        self._stall(AgentUnresponsive(self.silence.seconds))

    async def request(self, method: str, params: dict[str, Any]) -> tuple[Any, int]:
        """Send a request; return ``(result, response frame bytes)``. Raises :class:`AgentRpcError`
        or :class:`AgentExited`."""
        request_id = next(self._ids)
        future: asyncio.Future[tuple[Any, int]] = asyncio.get_running_loop().create_future()
        idle = not self._pending
        self._pending[request_id] = future
        if idle:  # the silence deadline counts from this request on
            self.silence.heard()
        try:
            await self._write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return await future
        finally:
            self._pending.pop(request_id, None)
            if future.cancelled() or not future.done():  # cancelling the waiter cancels the future
                self._give_up(request_id)

    def _give_up(self, request_id: int) -> None:
        self._abandoned[request_id] = True
        if len(self._abandoned) > ABANDONED_IDS_KEPT:
            del self._abandoned[next(iter(self._abandoned))]

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._write({"jsonrpc": "2.0", "method": method, "params": params})

    async def respond(self, request_id: Any, *, result: Any = None,
                      error: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            message["error"] = error
        else:
            message["result"] = result
        with contextlib.suppress(AgentExited):
            await self._write(message)
        self.silence.answered(request_id)

    # --- reading ----------------------------------------------------------------------------------

    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._stdout is not None
        stdout = self._stdout
        large_frames = False  # the last read's frames averaged LARGE_FRAME_BYTES or more
        try:
            while True:
                held = self.handler.backpressure()
                if held is not None:
                    # Not reading lets the stream's buffer fill, then the pipe's: the child blocks
                    # in its write until the journal catches up.
                    await held
                large = large_frames or self.decoder.buffered_bytes >= READ_CHUNK_BYTES
                self.silence.reading(True)
                chunks = await stdout.read_chunks(LARGE_READ_BYTES if large else READ_CHUNK_BYTES)
                self.silence.reading(False)  # handling what it read (or held back): not its silence
                if not chunks:
                    break
                errors_before = self.decoder.frame_errors
                items = self.decoder.feed(chunks[0])
                for chunk in chunks[1:]:
                    items += self.decoder.feed(chunk)
                if items:
                    large_frames = sum(map(len, chunks)) >= LARGE_FRAME_BYTES * len(items)
                # The read's frames feed the inbound tap at once (one call per read, not per frame).
                self.inbound.notify_read_frames(items, errors=self.decoder.frame_errors != errors_before)
                index = 0
                while index < len(items):
                    # Frames handled synchronously share one batch (one journal transaction); a
                    # handler that returns an awaitable ends the batch, and is awaited outside it.
                    pending: Awaitable[None] | None = None
                    try:
                        with self.handler.batch():
                            while index < len(items) and pending is None:
                                pending = self._dispatch(items[index])
                                index += 1
                    except Exception:
                        log.exception("pipe message handler failed", extra={"frames": len(items)})
                    if pending is not None:
                        try:
                            await pending
                        except Exception:
                            log.exception("pipe message handler failed")
                # read() does not yield while data is buffered: yield once per read chunk (at most
                # READ_CHUNK_BYTES of frames) so the SSE streams move those events to their sockets.
                # A subscriber queue bounded at a few chunks then only fills when its client is
                # really not reading.
                await asyncio.sleep(0)
            for error in self.decoder.eof():
                self._frame_error(error, error.size, error.reason)
        except Exception:
            log.exception("pipe reader failed")
        finally:
            returncode = await self._after_output(self._proc)
            self.returncode = returncode
            self.exited.set()
            self._fail_pending()
            try:
                self.handler.on_exit(returncode)
            except Exception:
                log.exception("child exit handler failed")

    def _frame_error(self, error: FrameError | None, size: int, reason: str) -> None:
        # A decoded frame that is not valid JSON-RPC was already observed as a read frame.
        self.instruments.record_dropped("inbound", size, observed=error is None)
        try:
            self.handler.on_frame_error(error, size, reason)
        except Exception:
            log.exception("frame error handler failed")

    def _dispatch(self, item: Frame | FrameError) -> Awaitable[None] | None:
        if not isinstance(item, Frame):
            self._frame_error(item, item.size, item.reason)
            return None
        message = item.message
        kind = message_kind(message)
        try:
            if kind in ("response", "error_response"):
                request_id = message["id"]
                future = self._pending.get(request_id) if isinstance(request_id, int) else None
                if future is None or future.done():
                    if isinstance(request_id, int) and self._abandoned.pop(request_id, False):
                        log.info("late response to a request given up dropped", extra={"bytes": item.size})
                    else:
                        log.warning("response to an unknown request id dropped", extra={"bytes": item.size})
                    return None
                if kind == "error_response":
                    error = message["error"]
                    future.set_exception(AgentRpcError(error if isinstance(error, dict) else {}))
                else:
                    future.set_result((message["result"], item.size))
            elif kind == "request":
                self.silence.asked(message["id"])
                return self.handler.on_request(item)
            elif kind == "notification":
                return self.handler.on_notification(item)
            else:
                self._frame_error(None, item.size, "invalid_jsonrpc")
        except Exception:
            log.exception("pipe message handler failed", extra={"bytes": item.size})
        return None

    async def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        stderr = self._proc.stderr
        line_max = self.budget.child_stderr_line_max_bytes
        current = 0
        while True:
            chunk = await stderr.read(READ_CHUNK_BYTES)
            if not chunk:
                break
            self.stderr.bytes += len(chunk)
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl == -1:
                    current += len(chunk) - start
                    break
                current += nl - start
                self.stderr.lines += 1
                if current > line_max:
                    self.stderr.long_lines += 1
                current = 0
                start = nl + 1

    # --- stopping ---------------------------------------------------------------------------------

    async def _after_output(self, proc: asyncio.subprocess.Process) -> int | None:
        """EOF on the child's stdout is its end: nothing it says can arrive any more. Its stdin is
        closed and it is given ``HOPLINE_CHILD_STOP_GRACE_SECONDS`` to exit; a child still running
        then (it closed its stdout and kept on) has its requests failed at once and its process
        tree stopped (SIGTERM, the grace again, SIGKILL). Its exit code."""
        self.output_closed = True
        self.silence.stop()
        grace = self.budget.child_stop_grace_seconds
        if proc.returncode is None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
            try:
                return await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
            except TimeoutError:
                pass
            log.warning("agent closed its stdout and did not exit: stopped",
                        extra={"graceSeconds": self.budget.child_stop_grace_seconds})
            self._fail_pending()
            await end_tree(proc, proc.wait, (signal.SIGTERM, signal.SIGKILL), grace)
        return await proc.wait()

    def freeze(self) -> None:
        """Stop the child's process group where it stands (SIGSTOP), now: it acts no more."""
        proc = self._proc
        if proc is not None and not self.exited.is_set():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGSTOP)

    async def kill(self) -> None:
        """End a frozen child's process tree with SIGKILL alone: it never runs again."""
        proc = self._proc
        if proc is not None and not self.exited.is_set():
            await end_tree(proc, self.exited.wait, (signal.SIGKILL,), self.budget.child_stop_grace_seconds)
        await self.stop()

    async def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if not self.exited.is_set():
            # its stdin closed first (a polite end), then SIGTERM, then SIGKILL
            await end_tree(proc, self.exited.wait, (None, signal.SIGTERM, signal.SIGKILL),
                           self.budget.child_stop_grace_seconds)
        for task in self._tasks:
            if not task.done():
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
