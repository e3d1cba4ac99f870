"""Wiring of `hopline agent`: stdio claimed, store opened, model chosen, the agent served.

The model: ``HOPLINE_GATEWAY_URL`` set -> the gateway over HTTP (``hopline.harness.http_model.HttpModel``)
with the session's own gateway token from the daemon (``_meta["hopline.credentials"]``), or, for an
agent run by hand against ``hopline gateway``, ``HOPLINE_INTERNAL_TOKEN``; otherwise the offline
scripted model in-process, so the agent works standalone. ``HOPLINE_SIDECAR_DIR`` (set by the daemon)
opens its sidecar store; each session's write token arrives in its ``session/new`` (SPEC S-3);
otherwise updates go inline.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hopline.budget import GATEWAY_URL_ENV, INTERNAL_TOKEN_ENV, Budget
from hopline.harness.acp.agent import HoplineAgent, LiveSession, ModelFactory, serve
from hopline.harness.acp.pipe import PipeTransport, claim_stdio
from hopline.harness.acp.requests import SessionCredentials
from hopline.harness.acp.sidecars import store_from_env
from hopline.harness.sessions import SessionStore, default_data_dir
from hopline.logs import configure_json_logging

log = logging.getLogger("hopline.agent")



def model_factory(budget: Budget, environ: Mapping[str, str], *, naive: bool = False) -> ModelFactory:
    """``naive``: the seed's engine had no pre-send ceiling check, so over-ceiling bodies are sent."""
    url = environ.get(GATEWAY_URL_ENV, "").strip()
    if url:
        from hopline.harness.http_model import HttpModel

        operator_token = environ.get(INTERNAL_TOKEN_ENV, "")

        def over_http(session_id: str, credentials: SessionCredentials) -> Any:
            token = credentials.gateway_token or operator_token
            return HttpModel(url, session_id, token, budget, enforce_ceiling=not naive)

        return over_http

    def scripted(session_id: str, credentials: SessionCredentials) -> Any:
        from hopline.harness.scripted import InProcessModel, ScriptedModel

        # Refuses bodies over the gateway limit like the embedded gateway would (413, origin code).
        return InProcessModel(ScriptedModel(summary_max_bytes=budget.summary_max_bytes),
                              max_body_bytes=budget.api_json_body_limit)

    return scripted


def loop_factory(budget: Budget, *, naive: bool = False) -> Any:
    def build(live: LiveSession, model: Any, sink: Any, permit: Any) -> Any:
        from hopline.harness.loop import ToolLoop
        from hopline.harness.profiles import get_profile
        from hopline.harness.tools import ReviewRange

        profile = get_profile(live.record.profile, budget)
        params = {"scripted": live.scripted} if live.scripted else None
        review = live.record.options.get("review")
        return ToolLoop(model, profile, Path(live.record.cwd), budget, sink=sink, permit=permit,
                        params=params, naive=naive,
                        review=ReviewRange.from_meta(review) if review else None)

    return build


async def _main(budget: Budget, read_fd: int, write_fd: int, naive: bool) -> None:
    environ = dict(os.environ)
    store = SessionStore(default_data_dir(environ))
    transport = await PipeTransport.open_fds(read_fd, write_fd, budget.agent_max_frame_bytes)
    sidecar_store = store_from_env(budget, environ)
    agent = HoplineAgent(budget, store, model_factory(budget, environ, naive=naive),
                         loop_factory(budget, naive=naive),
                         environ=environ, sidecar_store=sidecar_store)
    log.info("agent started", extra={"maxFrameBytes": budget.agent_max_frame_bytes,
                                     "sidecarStore": sidecar_store is not None})
    try:
        await serve(agent, transport)
    finally:
        await asyncio.to_thread(agent.close)
        store.close()
        if sidecar_store is not None:
            sidecar_store.close()
        log.info("agent stopped", extra={"framesDropped": transport.frames_dropped})


def run_stdio(budget: Budget, *, naive: bool = False) -> int:
    """Serve on this process's stdio until the peer closes stdin; returns the exit code.

    ``naive`` runs the tool loop with the seed's old rules (``HOPLINE_NAIVE=1``, for the demo).
    """
    read_fd, write_fd = claim_stdio()
    configure_json_logging()
    try:
        asyncio.run(_main(budget, read_fd, write_fd, naive))
    except KeyboardInterrupt:
        return 130
    return 0
