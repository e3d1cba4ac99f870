"""A write to a session another daemon owns (SPEC X): forwarded over HTTP to the owner's URL with
the cluster credential (``HOPLINE_CLUSTER_TOKEN``) and the header ``x-hopline-forwarded-by``; the
owner's answer is the client's answer, status and body."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hopline.budget import CEILINGS_BY_KEY, HOP_CLUSTER, Budget
from hopline.daemon.cluster.leases import Owner
from hopline.http.errors import error_response
from hopline.vocabulary import FORWARDED_BY_HEADER, IDEMPOTENCY_HEADER, REPLAYED_HEADER


class Forwarder:
    def __init__(self, budget: Budget, *, daemon_id: str, token: str,
                 owner_of: Callable[[str], Awaitable[Owner | None]]) -> None:
        self.budget = budget
        self.daemon_id = daemon_id
        self._token = token
        self._owner_of = owner_of
        self._http: httpx.AsyncClient | None = None
        self.forwarded = 0

    def open(self) -> None:
        self._http = httpx.AsyncClient(timeout=self.budget.cluster_forward_timeout_seconds)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def forward(self, owner: Owner, request: Request) -> Response | None:
        """The client's write, sent to the owner as it came (method, path, query, body); the owner's
        answer, status and JSON body, is the client's. None when the owner's lease expired while it
        did not answer (paused, partitioned): the caller adopts the session instead (the owner's
        late writes, if any, are fenced by the journal)."""
        assert self._http is not None
        lease_seconds = self.budget.owner_lease_seconds
        url = owner.url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {"authorization": f"Bearer {self._token}", FORWARDED_BY_HEADER: self.daemon_id,
                   "content-type": request.headers.get("content-type", "application/json")}
        if IDEMPOTENCY_HEADER in request.headers:  # the owner stores it, and answers a retry from it
            headers[IDEMPOTENCY_HEADER] = request.headers[IDEMPOTENCY_HEADER]
        body = await request.body()
        self.forwarded += 1
        sent = asyncio.ensure_future(self._http.request(request.method, url, content=body, headers=headers))
        try:
            while True:  # a live owner renews its lease while it works; a silent one lets it expire
                wait = max(owner.expires_in, 0) + lease_seconds / 3
                done, _ = await asyncio.wait({sent}, timeout=wait)
                if done:
                    break
                current = await self._owner_of(request.path_params.get("session_id", ""))
                if current is None or not current.live or current.daemon_id != owner.daemon_id:
                    sent.cancel()
                    return None
                owner = current
            answer = sent.result()
        except httpx.TimeoutException:
            timeout = self.budget.cluster_forward_timeout_seconds
            setting = CEILINGS_BY_KEY["cluster_forward_timeout_seconds"].name
            return _cluster_error(504, "owner_timeout", f"the daemon that owns this session did not answer "
                                  f"within {timeout} s ({setting})")
        except httpx.HTTPError:
            retry = max(1, int(owner.expires_in) + 1)
            return _cluster_error(503, "owner_unreachable",
                                  "the daemon that owns this session cannot be reached; once its lease "
                                  f"expires (in about {retry} s) any daemon adopts the session: retry then",
                                  headers={"retry-after": str(retry)})
        finally:
            if not sent.done():
                sent.cancel()
        kept = {name: answer.headers[name] for name in ("retry-after", REPLAYED_HEADER.lower())
                if name in answer.headers}
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type"), headers=kept)


def _cluster_error(status: int, kind: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return error_response(status, HOP_CLUSTER, kind, message, headers=headers)
