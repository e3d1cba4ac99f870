"""Wiring of `hopline agent`: stdio claimed, store opened, model chosen, the agent served.

The model: ``HOPLINE_GATEWAY_URL`` set -> the gateway over HTTP (``hopline.harness.http_model.HttpModel``)
with the session's own gateway token from the daemon (``_meta["hopline.credentials"]``), or, for an
agent run by hand against ``hopline gateway``, ``HOPLINE_INTERNAL_TOKEN``; otherwise the setup's
standalone model in-process (``hopline agent`` passes the offline scripted model), so the agent works
alone. ``HOPLINE_SIDECAR_DIR`` (set by the daemon)
opens its sidecar store; each session's write token arrives in its ``session/new`` (SPEC S-3);
otherwise updates go inline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hopline.budget import GATEWAY_URL_ENV, INTERNAL_TOKEN_ENV, Budget
from hopline.harness.acp.agent import HintCheck, HoplineAgent, LiveSession, ModelFactory, serve
from hopline.harness.acp.pipe import PipeTransport, claim_stdio
from hopline.harness.acp.requests import SessionCredentials
from hopline.harness.acp.sidecars import store_from_env
from hopline.harness.model import Model
from hopline.harness.sessions import SessionStore, default_data_dir
from hopline.harness.sizing import BUDGETED, Sizing
from hopline.logs import configure_json_logging

log = logging.getLogger("hopline.agent")


@dataclasses.dataclass(frozen=True)
class AgentSetup:
    """What ``hopline agent`` is built with besides its budget and environment: the model a session
    uses when no gateway is set (made on demand: a warm child that never runs a turn does not load
    it), the check of a session's model hints, and the sizing its loops and HTTP models run by."""

    standalone_model: Callable[[], Model]
    check_hints: HintCheck | None = None
    sizing: Sizing = BUDGETED


def model_factory(budget: Budget, environ: Mapping[str, str], setup: AgentSetup) -> ModelFactory:
    url = environ.get(GATEWAY_URL_ENV, "").strip()
    if url:
        from hopline.harness.http_model import HttpModel

        operator_token = environ.get(INTERNAL_TOKEN_ENV, "")

        def over_http(session_id: str, credentials: SessionCredentials) -> Any:
            token = credentials.gateway_token or operator_token
            return HttpModel(url, session_id, token, budget, sizing=setup.sizing)

        return over_http

    def standalone(session_id: str, credentials: SessionCredentials) -> Model:
        return setup.standalone_model()

    return standalone


def loop_factory(budget: Budget, sizing: Sizing) -> Any:
    def build(live: LiveSession, model: Any, sink: Any, permit: Any) -> Any:
        from hopline.harness.loop import ToolLoop
        from hopline.harness.profiles import get_profile
        from hopline.harness.tools import ReviewRange

        profile = get_profile(live.record.profile, budget)
        params = {"scripted": live.scripted} if live.scripted else None
        review = live.record.options.get("review")
        return ToolLoop(model, profile, Path(live.record.cwd), budget, sink=sink, permit=permit,
                        params=params, sizing=sizing,
                        review=ReviewRange.from_meta(review) if review else None)

    return build


async def _main(budget: Budget, setup: AgentSetup, read_fd: int, write_fd: int) -> None:
    environ = dict(os.environ)
    store = SessionStore(default_data_dir(environ))
    transport = await PipeTransport.open_fds(read_fd, write_fd, budget.agent_max_frame_bytes)
    sidecar_store = store_from_env(budget, environ)
    agent = HoplineAgent(budget, store, model_factory(budget, environ, setup),
                         loop_factory(budget, setup.sizing),
                         environ=environ, sidecar_store=sidecar_store, check_hints=setup.check_hints)
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


def run_stdio(budget: Budget, setup: AgentSetup) -> int:
    """Serve on this process's stdio until the peer closes stdin; returns the exit code."""
    read_fd, write_fd = claim_stdio()
    configure_json_logging()
    try:
        asyncio.run(_main(budget, setup, read_fd, write_fd))
    except KeyboardInterrupt:
        return 130
    return 0
