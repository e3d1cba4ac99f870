"""``DaemonClient``: the async Python SDK for the hopline daemon's HTTP + SSE API (SPEC C-1).

The event iterator reads SSE with the bounded :class:`~hopline.wire.sse.SseParser` over
``response.aiter_bytes()`` and resumes a dropped stream with ``Last-Event-ID``; events are
deduplicated by id, so a resume neither loses nor repeats one. Writes go with an
``Idempotency-Key`` and are retried when their answer is lost (:mod:`hopline.client.retry`): none
runs twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import httpx
import orjson

from hopline.budget import (
    CEILINGS_BY_KEY,
    HOP_CLIENT_SSE,
    HOP_DAEMON_API,
    SERVER_TOKEN_ENV,
    URL_ENV,
    Budget,
    LimitExceeded,
)
from hopline.client import retry
from hopline.client.answers import (
    Cancelled,
    DaemonStatus,
    GateRun,
    GateSummary,
    Health,
    Loaded,
    PermissionAnswered,
    SessionShown,
    SessionSummary,
    TranscriptPage,
)
from hopline.client.events import Event, SidecarRef, to_event
from hopline.errors import ClientError, ConfigError, DaemonError, SidecarIntegrityError, SseReconnectExhausted
from hopline.sidecars.projection import restore_update
from hopline.vocabulary import IDEMPOTENCY_HEADER, META_SIDECAR
from hopline.wire.sse import SseParser

log = logging.getLogger("hopline.client")


class RequestTooLarge(DaemonError, LimitExceeded):
    """A request body over the daemon's JSON body limit: refused by the client, never sent. Both a
    :class:`DaemonError` (status 413, the daemon's body) and a :class:`LimitExceeded`."""

    def __init__(self, method: str, route: str, limit: int, observed: int) -> None:
        ceiling = CEILINGS_BY_KEY["daemon_json_body_limit"]
        LimitExceeded.__init__(self, ceiling.hop, ceiling.name, limit, observed,
                                 f"request body over the daemon JSON body limit ({ceiling.name}); not sent",
                                 kind="request_too_large")
        DaemonError.__init__(self, 413, self.to_json(), method, route)


class NoDaemonUrl(ConfigError):
    """``DaemonClient()`` was given no URL and ``$HOPLINE_URL`` is not set."""


class _StreamEnded(ClientError):
    """The server ended the SSE response (no error): resume like a drop."""


# Errors that mean "the connection went away": resume with Last-Event-ID.
_DROPS: tuple[type[Exception], ...] = (
    httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.ConnectError,
    httpx.ConnectTimeout, httpx.WriteError, httpx.PoolTimeout, _StreamEnded,
)


class DaemonClient:
    """Async client for one daemon. Use as ``async with DaemonClient(url, token) as client``;
    ``DaemonClient()`` reads both from ``$HOPLINE_URL`` and ``$HOPLINE_SERVER_TOKEN`` (a token of
    ``""`` sends none)."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, budget: Budget | None = None,
                 http: httpx.AsyncClient | None = None, reconnect_attempts: int | None = None,
                 reconnect_backoff_seconds: float | None = None) -> None:
        base_url = base_url or os.environ.get(URL_ENV)
        if not base_url:
            raise NoDaemonUrl(f"no daemon URL: pass one to DaemonClient or set {URL_ENV}")
        token = token if token is not None else os.environ.get(SERVER_TOKEN_ENV)
        self.base_url = base_url.rstrip("/")
        self.budget = budget or Budget.from_env()
        # Consecutive failed reconnects of an event stream before giving up, and the first backoff.
        self.reconnect_attempts = (reconnect_attempts if reconnect_attempts is not None
                                   else self.budget.client_sse_reconnect_attempts)
        self.reconnect_backoff_seconds = (reconnect_backoff_seconds if reconnect_backoff_seconds is not None
                                          else self.budget.client_sse_reconnect_backoff_seconds)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=self.budget.client_http_timeout_seconds)
        # Counters of the last event stream (read by tests and the CLI).
        self.reconnects = 0
        self.max_buffered = 0
        self.write_retries = 0  # writes sent again, with their key (a lost answer, a refusal to retry)

    async def __aenter__(self) -> DaemonClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    # --- plain API calls ----------------------------------------------------------------------

    async def _send(self, method: str, route: str, *, content: bytes | None = None,
                    params: dict[str, Any] | None = None,
                    headers: dict[str, str] | None = None) -> httpx.Response:
        """One request; a transport failure becomes a :class:`DaemonError` with status 0."""
        try:
            return await self._http.request(method, self.base_url + route, content=content, params=params,
                                            headers=headers if headers is not None else self._headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            message = f"nothing answers at {self.base_url} (is a hopline daemon running there?)"
            raise DaemonError(0, {"error": {"hop": HOP_DAEMON_API, "type": "daemon_unreachable",
                                            "message": message}}, method, _route_shape(route)) from exc
        except httpx.TransportError as exc:
            raise DaemonError(0, {"error": {"hop": HOP_DAEMON_API, "type": "connection_failed",
                                            "message": f"{type(exc).__name__}: {exc}"[:256]}},
                              method, _route_shape(route)) from exc

    async def _call(self, method: str, route: str, *, json: Any = None,
                    params: dict[str, Any] | None = None, expect: tuple[int, ...] = (200,),
                    headers: dict[str, str] | None = None) -> Any:
        shape = _route_shape(route)
        content: bytes | None = None
        headers = dict(self._headers, **headers) if headers else self._headers
        if json is not None:
            # Sized before sending: a body over the daemon's limit is refused here, by name, instead
            # of being cut off mid-upload by the daemon (which then closes the connection).
            content = orjson.dumps(json)
            limit = self.budget.daemon_json_body_limit
            if len(content) > limit:
                raise RequestTooLarge(method, shape, limit, len(content))
            headers = dict(headers, **{"content-type": "application/json"})
        response = await self._send(method, route, content=content, params=params, headers=headers)
        body: Any
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text[:512]
        if response.status_code not in expect:
            error = DaemonError(response.status_code, body, method, shape)
            after = response.headers.get("retry-after", "")
            error.retry_after = float(after) if after.isdigit() else None
            raise error
        return body

    async def _write(self, method: str, route: str, *, json: Any = None, expect: tuple[int, ...],
                     keyed: bool = True, gone_is_done: bool = False) -> Any:
        """A write, sent again with the same Idempotency-Key (``keyed``) while its answer is lost or
        the daemon says it did not run it (:mod:`hopline.client.retry`). ``gone_is_done``: a 404 to a
        retry means the lost first attempt did it (a delete)."""
        headers = {IDEMPOTENCY_HEADER: retry.new_key()} if keyed else None
        attempt = 0
        while True:
            try:
                return await self._call(method, route, json=json, expect=expect, headers=headers)
            except DaemonError as error:
                if attempt and gone_is_done and error.status == 404:
                    return None
                if attempt >= self.budget.client_write_retry_attempts or not retry.retried(error.status,
                                                                                          error.type):
                    raise
                attempt += 1
                self.write_retries += 1
                log.info("write retried", extra={"hop": HOP_DAEMON_API, "attempt": attempt,
                                                 "status": error.status, "error": error.type})
                await asyncio.sleep(retry.pause(self.budget, attempt, error.retry_after))

    async def health(self) -> Health:
        return cast(Health, await self._call("GET", "/health"))

    async def create_session(self, cwd: str | None = None, profile: str | None = None,
                             permission_mode: str | None = None,
                             scripted: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {}
        if cwd is not None:
            body["cwd"] = cwd
        if profile is not None:
            body["profile"] = profile
        if permission_mode is not None:
            body["permissionMode"] = permission_mode
        if scripted is not None:
            body["scripted"] = scripted
        result = await self._write("POST", "/session", json=body, expect=(200, 201))
        return str(result["sessionId"])

    async def prompt(self, session_id: str, text: str, *,
                     blocks: list[dict[str, Any]] | None = None) -> str:
        """Send a prompt: ``text``, or with ``blocks`` (ACP content blocks, e.g. from
        :func:`hopline.client.content.prompt_with_attachments`) those blocks, ``text`` unused."""
        body: dict[str, Any] = {"prompt": blocks} if blocks is not None else {"text": text}
        result = await self._write("POST", f"/session/{session_id}/prompt", json=body, expect=(200, 202))
        return str(result["promptId"])

    async def cancel(self, session_id: str) -> Cancelled:
        return cast(Cancelled, await self._write("POST", f"/session/{session_id}/cancel",
                                                 expect=(200, 202, 204)))

    async def load(self, session_id: str) -> Loaded:
        return cast(Loaded, await self._call("POST", f"/session/{session_id}/load", expect=(200, 202)))

    async def transcript(self, session_id: str, cursor: str | None = None) -> TranscriptPage:
        params = {"cursor": cursor} if cursor is not None else None
        result = await self._call("GET", f"/session/{session_id}/transcript", params=params)
        return TranscriptPage(list(result.get("events") or []), result.get("nextCursor"))

    async def answer_permission(self, session_id: str, request_id: str, option_id: str) -> PermissionAnswered:
        answer = await self._write("POST", f"/session/{session_id}/permission/{request_id}",
                                   json={"optionId": option_id}, expect=(200, 202, 204))
        return cast(PermissionAnswered, answer)

    async def delete_session(self, session_id: str) -> None:
        await self._write("DELETE", f"/session/{session_id}", expect=(200, 202, 204), keyed=False,
                          gone_is_done=True)

    async def sessions(self, limit: int | None = None) -> tuple[list[SessionSummary], int]:
        """``GET /session``: the newest sessions (what each is doing), and how many there are."""
        result = await self._call("GET", "/session", params={"limit": limit} if limit is not None else None)
        return list(result.get("sessions") or []), int(result.get("total") or 0)

    async def session(self, session_id: str) -> SessionShown:
        """``GET /session/{id}``: one session, what it is doing, and its last event id."""
        return cast(SessionShown, await self._call("GET", f"/session/{session_id}"))

    async def status(self) -> DaemonStatus:
        return cast(DaemonStatus, await self._call("GET", "/daemon/status"))

    # --- gate runs (SPEC K) ---------------------------------------------------------------------

    async def start_gate(self, repo: str, *, base: str | None = None, head: str | None = None,
                         agents: list[str] | None = None, dev_session_id: str | None = None,
                         fix: bool = False, rounds: int | None = None,
                         scripted: dict[str, Any] | None = None, test_command: str | None = None,
                         allow_unsandboxed: bool = False, python: str | None = None) -> str:
        """``POST /gate``: the new run's id."""
        body: dict[str, Any] = {"repo": repo, "fix": fix}
        if allow_unsandboxed:
            body["allowUnsandboxed"] = True
        for key, value in (("base", base), ("head", head), ("agents", agents),
                           ("devSessionId", dev_session_id), ("rounds", rounds), ("scripted", scripted),
                           ("testCommand", test_command), ("python", python)):
            if value is not None:
                body[key] = value
        result = await self._call("POST", "/gate", json=body, expect=(202,))
        return str(result["gateId"])

    async def gates(self) -> list[GateSummary]:
        """``GET /gate``: the runs this daemon keeps in memory (in progress, and the latest ended)."""
        result = await self._call("GET", "/gate")
        return list(result.get("gates") or [])

    async def gate(self, gate_id: str) -> GateRun:
        """``GET /gate/{id}``: the run's state, and its result once it ended."""
        return cast(GateRun, await self._call("GET", f"/gate/{gate_id}"))

    async def cancel_gate(self, gate_id: str) -> bool:
        result = await self._call("POST", f"/gate/{gate_id}/cancel")
        return bool(result.get("cancelled"))

    async def metrics(self) -> str:
        """The Prometheus text of ``GET /metrics`` (pipe histogram, gateway requests by status)."""
        response = await self._send("GET", "/metrics")
        if response.status_code != 200:
            raise DaemonError(response.status_code, response.text[:512], "GET", "/metrics")
        return response.text

    # --- the event stream ---------------------------------------------------------------------

    def events(self, session_id: str, *, last_event_id: int | None = None,
               max_queued: int | None = None) -> AsyncGenerator[Event, None]:
        """Yield the session's events in id order; resume a dropped stream with ``Last-Event-ID``.

        Events with an id at or below the last one seen are skipped (a resume may repeat them).
        Raises :class:`~hopline.wire.sse.SseEventTooLarge` for an event over the client limit and
        :class:`SseReconnectExhausted` when the stream cannot be re-established.
        """
        return self._stream(f"/session/{session_id}/events", last_event_id=last_event_id,
                            max_queued=max_queued)

    def gate_events(self, gate_id: str, *, last_event_id: int | None = 0,
                    max_queued: int | None = None) -> AsyncGenerator[Event, None]:
        """A gate run's events (``GET /gate/{id}/events``), from its first by default, resumed like a
        session's; the stream goes on after ``gate_complete`` (stop there)."""
        return self._stream(f"/gate/{gate_id}/events", last_event_id=last_event_id, max_queued=max_queued)

    async def _stream(self, route: str, *, last_event_id: int | None,
                      max_queued: int | None) -> AsyncGenerator[Event, None]:
        last_id = last_event_id
        failures = 0
        attempts = self.reconnect_attempts
        backoff = self.reconnect_backoff_seconds
        params = {"maxQueued": max_queued} if max_queued is not None else None
        # A read timeout well above the heartbeat interval: silence this long is a dead connection.
        timeout = httpx.Timeout(self.budget.client_http_timeout_seconds,
                                read=max(3 * self.budget.sse_heartbeat_seconds, 1.0))
        self.reconnects = 0
        while True:
            headers = dict(self._headers, Accept="text/event-stream")
            if last_id is not None:
                headers["Last-Event-ID"] = str(last_id)
            parser = SseParser(self.budget.client_sse_max_event_bytes)
            delivered = False
            try:
                async with self._http.stream("GET", f"{self.base_url}{route}",
                                             params=params, headers=headers, timeout=timeout) as response:
                    if response.status_code != 200:
                        body = await _read_error_body(response, self.budget.daemon_json_body_limit)
                        raise DaemonError(response.status_code, body, "GET", _route_shape(route))
                    async for chunk in response.aiter_bytes():
                        messages = parser.feed(chunk)
                        self.max_buffered = max(self.max_buffered, parser.max_buffered)
                        for message in messages:
                            event = to_event(message)
                            if event.type == "state_resync_required":
                                # The daemon's journal is behind our Last-Event-ID: follow its
                                # numbering, or every later event would look like a duplicate.
                                latest = event.data.get("latestEventId")
                                if isinstance(latest, int) and not isinstance(latest, bool):
                                    last_id = latest
                            if event.id is not None:
                                if last_id is not None and event.id <= last_id:
                                    continue  # already delivered before a resume
                                last_id = event.id
                            delivered = True
                            yield event
                raise _StreamEnded("the server ended the event stream")
            except _DROPS as exc:
                # Consecutive failures only: a connection that delivered events resets the count.
                failures = 1 if delivered else failures + 1
                if failures > attempts:
                    raise SseReconnectExhausted(attempts, last_id, exc) from exc
                self.reconnects += 1
                log.info("sse reconnect", extra={"hop": HOP_CLIENT_SSE, "attempt": failures,
                                                 "error": type(exc).__name__})
                await asyncio.sleep(min(backoff * (2 ** (failures - 1)), backoff * 32))

    async def turn_events(self, session_id: str, prompt_id: str, *, last_event_id: int | None = 0,
                          max_queued: int | None = None) -> AsyncGenerator[Event, None]:
        """The session's events up to and including the end (complete or error) of ``prompt_id``.

        Starts from ``last_event_id`` (0: the session's first event), so nothing the turn emitted
        before the subscription is missed.
        """
        stream = self.events(session_id, last_event_id=last_event_id, max_queued=max_queued)
        try:
            async for event in stream:
                yield event
                if event.is_turn_end and event.prompt_id == prompt_id:
                    return
        finally:
            await stream.aclose()

    # --- sidecars -----------------------------------------------------------------------------

    async def download_sidecar(self, session_id: str, sidecar_id: str, write: Callable[[bytes], Any], *,
                               max_bytes: int | None = None, sha256: str | None = None) -> tuple[int, str]:
        """Stream one sidecar's bytes to ``write``; return ``(size, sha256)``. The body is checked
        against its ETag (the sha256 the daemon stored), its ``Content-Length``, ``max_bytes`` (default:
        the object quota) and ``sha256`` when given (:class:`SidecarIntegrityError` if not)."""
        limit = self.budget.sidecar_max_object_bytes if max_bytes is None else max_bytes
        digest = hashlib.sha256()
        size = 0
        route = f"/session/{session_id}/sidecars/{sidecar_id}"
        async with self._http.stream("GET", self.base_url + route, headers=self._headers) as response:
            if response.status_code != 200:
                body = await _read_error_body(response, self.budget.daemon_json_body_limit)
                raise DaemonError(response.status_code, body, "GET", "/session/{id}/sidecars/{sidecarId}")
            etag = response.headers.get("etag")
            expected = sha256 if sha256 is not None else (etag.strip('W/"') if etag else None)
            if etag is not None and expected is not None and etag.strip('W/"') != expected:
                raise SidecarIntegrityError(sidecar_id,
                                            "the server's ETag does not match the declared sha256")
            async for chunk in response.aiter_bytes():
                if size + len(chunk) > limit:
                    raise SidecarIntegrityError(sidecar_id, f"body exceeds its declared {limit} bytes "
                                                            f"(read {size + len(chunk)} so far)")
                size += len(chunk)
                digest.update(chunk)
                write(chunk)
            length = response.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) != size:
            raise SidecarIntegrityError(sidecar_id, f"body is {size} bytes, Content-Length said {length}")
        if expected is not None and digest.hexdigest() != expected:
            raise SidecarIntegrityError(sidecar_id, "sha256 mismatch: the body is not the one declared")
        return size, digest.hexdigest()

    async def resolve_sidecar(self, session_id: str, entry: SidecarRef | dict[str, Any]) -> bytes:
        """Fetch a sidecar and verify its size and sha256 (:class:`SidecarIntegrityError` if not)."""
        ref = entry if isinstance(entry, SidecarRef) else SidecarRef.from_json(entry)
        if not ref.resolvable or ref.id is None or ref.sha256 is None:
            raise SidecarIntegrityError(str(ref.id), f"not resolvable (truncated={ref.truncated}, "
                                                     f"reason={ref.reason})")
        if ref.bytes > self.budget.sidecar_max_object_bytes:
            raise SidecarIntegrityError(ref.id, f"declares {ref.bytes} bytes, over the object limit "
                                                f"{self.budget.sidecar_max_object_bytes}")
        body = bytearray()
        size, _ = await self.download_sidecar(session_id, ref.id, body.extend, max_bytes=ref.bytes,
                                              sha256=ref.sha256)
        if size != ref.bytes:
            raise SidecarIntegrityError(ref.id, f"body is {size} bytes, declared {ref.bytes}")
        return bytes(body)

    async def resolve_update(self, session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        """The original of a projected update: every sidecar fetched (size and sha256 verified) and
        set back at its path. Raises :class:`SidecarIntegrityError` for a truncated field (its
        bytes were lost: the entry says how many) or a body that does not match its entry."""
        meta = update.get("_meta")
        entries = meta.get(META_SIDECAR) if isinstance(meta, dict) else None
        if not isinstance(entries, list) or not entries:
            return update
        bodies: dict[str, bytes] = {}
        for entry in entries:
            ref = SidecarRef.from_json(entry) if isinstance(entry, dict) else None
            if ref is None or not ref.resolvable or ref.id is None:
                raise SidecarIntegrityError(str(getattr(ref, "id", None)),
                                            f"field {getattr(ref, 'field', '?')} is truncated "
                                            f"({getattr(ref, 'reason', None)}): "
                                            f"{getattr(ref, 'lost_bytes', 0)} bytes were lost")
            if ref.id not in bodies:
                bodies[ref.id] = await self.resolve_sidecar(session_id, ref)
        try:
            return restore_update(update, lambda entry: bodies[str(entry["id"])])
        except (ValueError, KeyError) as exc:
            raise SidecarIntegrityError("-", f"cannot restore the update: {exc}") from None


async def _read_error_body(response: httpx.Response, limit: int) -> Any:
    """An error body, read up to ``limit`` (errors are JSON objects of a few hundred bytes)."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > limit:
            break
    try:
        return orjson.loads(bytes(data))
    except orjson.JSONDecodeError:
        return bytes(data[:512]).decode("utf-8", "replace")


def _route_shape(route: str) -> str:
    """The route with ids replaced, so error messages never carry a session id."""
    parts = route.split("/")
    if len(parts) > 2 and parts[1] in ("session", "gate") and parts[2]:
        parts[2] = "{id}"
    if len(parts) > 4 and parts[3] in ("permission", "sidecars"):
        parts[4] = "{id}"
    return "/".join(parts)
