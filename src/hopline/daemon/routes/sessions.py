"""The session routes (SPEC D-1, D-6, D-7): create, prompt, cancel, events, load, transcript,
permission answers, delete; the sidecar routes under a session."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hopline.budget import MAX_QUEUED_RANGE
from hopline.daemon.content import prompt_blocks
from hopline.daemon.errors import SessionError
from hopline.daemon.parts import DaemonParts
from hopline.daemon.routes.owner import OwnerWrites
from hopline.daemon.routes.sse import open_event_stream
from hopline.daemon.sessions.keys import request_shape
from hopline.daemon.sessions.state import DaemonSession
from hopline.daemon.transcript import transcript_page
from hopline.scripted.hints import scripted_hints
from hopline.store.idempotency import KeyRecord
from hopline.vocabulary import IDEMPOTENCY_HEADER
from hopline.wire.input import parse_decimal_id

# The most sessions one GET /session lists (the newest first; ``total`` says how many there are).
SESSIONS_LISTED_MAX = 1000
# The error statuses every session route may answer (the OpenAPI document lists them).
ERRORS: dict[int | str, dict[str, Any]] = {400: {}, 401: {}, 404: {}, 408: {}, 409: {}, 413: {}, 422: {}}
# A write's idempotency key (SPEC T-12, daemon/sessions/keys.py): a retry with it runs nothing twice.
IdempotencyKey = Annotated[str | None, Header(alias=IDEMPOTENCY_HEADER)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSessionBody(_Body):
    cwd: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    profile: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")] | None = None
    permissionMode: Literal["auto", "ask"] | None = None
    scripted: dict[str, Any] | None = None


class PromptBody(_Body):
    """``text`` (one text block), or ``prompt``: ACP content blocks (:mod:`hopline.daemon.content`)."""

    text: Annotated[str, Field(min_length=1)] | None = None
    prompt: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> PromptBody:
        if (self.text is None) == (self.prompt is None):
            raise ValueError("give exactly one of text or prompt (a list of ACP content blocks)")
        return self


class PermissionBody(_Body):
    optionId: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    outcome: Literal["reject"] | None = None

    @model_validator(mode="after")
    def _one_answer(self) -> PermissionBody:
        if (self.optionId is None) == (self.outcome is None):
            raise ValueError("give exactly one of optionId or outcome: 'reject'")
        return self


class SessionCreated(BaseModel):
    sessionId: str


class PromptAccepted(BaseModel):
    promptId: str


def session_router(parts: DaemonParts, route_class: Any) -> APIRouter:
    budget, manager, gates, keys = parts.budget, parts.manager, parts.gates, parts.manager.keys
    owner = OwnerWrites(manager, parts.cluster)
    router = APIRouter(route_class=route_class)

    async def session_of(session_id: str) -> DaemonSession:
        if len(session_id) > budget.path_id_max_chars:  # opaque tokens: refused before any lookup
            raise SessionError(404, "unknown_session", "no such session")
        return await manager.get(session_id)

    _create_route(router, parts, owner)

    @router.post("/session/{session_id}/prompt", status_code=202, response_model=PromptAccepted,
                 responses={**ERRORS, 429: {}})
    async def prompt(session_id: str, body: PromptBody, request: Request,
                     idempotency_key: IdempotencyKey = None) -> Any:
        shape = request_shape("POST /session/{id}/prompt", (session_id,), body)
        async with keys.claim(idempotency_key, shape) as claim:
            session = await session_of(session_id)
            gates.check_prompt(session.id)  # a dev session awaiting a gate takes no prompt (409, K-2)
            if (answer := await owner.forward(request, session)) is not None:
                return answer
            blocks = prompt_blocks(body.text, body.prompt, budget)
            return {"promptId": await manager.prompt(session, blocks, claim)}

    @router.post("/session/{session_id}/cancel", responses=ERRORS)
    async def cancel(session_id: str, request: Request, idempotency_key: IdempotencyKey = None) -> Any:
        async with keys.claim(idempotency_key, request_shape("POST /session/{id}/cancel", (session_id,),
                                                             None)) as claim:
            session = await session_of(session_id)
            if (answer := await owner.forward(request, session)) is not None:
                return answer
            return {"cancelled": await manager.cancel(session, claim)}

    @router.post("/session/{session_id}/load", responses={**ERRORS, 502: {}, 503: {}, 504: {}})
    async def load(session_id: str, request: Request) -> Any:
        session = await session_of(session_id)
        if (answer := await owner.forward(request, session)) is not None:
            return answer
        return await manager.load(session)

    @router.post("/session/{session_id}/permission/{request_id}", responses=ERRORS)
    async def permission(session_id: str, request_id: str, body: PermissionBody, request: Request,
                         idempotency_key: IdempotencyKey = None) -> Any:
        request_id = request_id[:budget.path_id_max_chars]
        shape = request_shape("POST /session/{id}/permission/{requestId}", (session_id, request_id), body)
        async with keys.claim(idempotency_key, shape) as claim:
            session = await session_of(session_id)
            if (answer := await owner.forward(request, session)) is not None:
                return answer
            outcome = await manager.answer_permission(session, request_id, option_id=body.optionId,
                                                      reject=body.outcome == "reject", key=claim)
            return {"requestId": request_id, "outcome": outcome}

    @router.delete("/session/{session_id}", responses=ERRORS)
    async def delete_session(session_id: str, request: Request) -> Any:
        session = await session_of(session_id)
        if (answer := await owner.forward(request, session, spawn=False)) is not None:  # no agent to delete
            return answer
        await manager.delete(session)
        return {"deleted": True}

    if parts.store is not None:
        from hopline.sidecars.routes import sidecar_router

        async def sidecar_session(session_id: str) -> None:
            await session_of(session_id)  # 404 for a session this daemon does not know (D-7)

        router.include_router(sidecar_router(parts.store, authorize=sidecar_session))
    _reading_routes(router, parts, session_of)
    return router


def _create_route(router: APIRouter, parts: DaemonParts, owner: OwnerWrites) -> None:
    """``POST /session``."""
    budget, manager = parts.budget, parts.manager

    @router.post("/session", response_model=SessionCreated, responses={**ERRORS, 502: {}, 503: {}, 504: {}})
    async def create_session(body: CreateSessionBody, request: Request,
                             idempotency_key: IdempotencyKey = None) -> Any:
        cwd = body.cwd if body.cwd is not None else str(Path.cwd())
        if not Path(cwd).is_absolute() or not Path(cwd).is_dir():
            raise SessionError(422, "invalid_cwd", "cwd must be an absolute path to an existing directory")
        if body.scripted is not None:
            scripted_hints(body.scripted, budget, unknown=True)

        async def created(record: KeyRecord) -> Response | None:
            # Answered by the session's owner (forwarded, with the key): the first create may still be
            # starting the agent there, and the retry's answer waits for it; a dead owner's is adopted.
            return await owner.forward(request, await manager.get(record.session_id))

        shape = request_shape("POST /session", (), body)
        async with manager.keys.claim(idempotency_key, shape, on_replay=created) as claim:
            session = await manager.create(cwd=cwd, profile=body.profile, permission_mode=body.permissionMode,
                                           scripted=body.scripted, key=claim)
            return {"sessionId": session.id}


def _reading_routes(router: APIRouter, parts: DaemonParts,
                    session_of: Callable[[str], Awaitable[DaemonSession]]) -> None:
    """The routes that only read a session (any daemon answers them: no owner rule)."""
    budget, bus, journal, manager = parts.budget, parts.bus, parts.journal, parts.manager

    @router.get("/session", responses=ERRORS)
    async def list_sessions(limit: Annotated[int, Query(ge=1, le=SESSIONS_LISTED_MAX)] = 100) -> Any:
        """The newest sessions of the store, what each is doing, and how many there are."""
        rows, total = await manager.listing(limit)
        return {"sessions": rows, "total": total}

    @router.get("/session/{session_id}", responses=ERRORS)
    async def show_session(session_id: str) -> Any:
        session = await session_of(session_id)
        row = manager.summary(session.id, await journal.get_session(session.id))
        row["lastEventId"] = await journal.last_id(session.id)
        return row

    @router.get("/session/{session_id}/events", responses={**ERRORS, 429: {}})
    async def events(
        session_id: str,
        maxQueued: Annotated[int | None, Query(ge=MAX_QUEUED_RANGE[0], le=MAX_QUEUED_RANGE[1])] = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    ) -> Any:
        session = await session_of(session_id)
        return await open_event_stream(bus, budget, session.id, max_queued=maxQueued,
                                       last_event_id=last_event_id)

    @router.get("/session/{session_id}/transcript", responses=ERRORS)
    async def transcript(session_id: str,
                         cursor: Annotated[str | None, Query(max_length=20)] = None) -> Response:
        session = await session_of(session_id)
        after = parse_decimal_id(cursor, "cursor") if cursor else 0
        page = await transcript_page(journal, session.id, after,
                                     page_max_bytes=budget.transcript_page_max_bytes,
                                     envelope_bytes=budget.transcript_page_envelope_bytes)
        return Response(page, media_type="application/json")
