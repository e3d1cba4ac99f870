"""`hopline agent`: the harness served as an ACP agent on stdio (SPEC H-10)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from hopline.cli._common import budget_or_exit, require_coherent_or_exit

if TYPE_CHECKING:
    from hopline.budget import Budget
    from hopline.harness.acp.runtime import AgentSetup


def offline_setup(budget: Budget, *, naive: bool) -> AgentSetup:
    """The offline scripted model when no gateway is set (it refuses a body over the gateway's limit
    as the embedded gateway would: 413, origin code), its hints checked at ``session/new``; the
    budget's sizing, or with ``naive`` the replay of an engine without it."""
    from hopline.harness.acp.runtime import AgentSetup
    from hopline.harness.sizing import BUDGETED
    from hopline.scripted.hints import scripted_hints

    def standalone_model() -> Any:
        from hopline.scripted.model import InProcessModel, ScriptedModel

        return InProcessModel(ScriptedModel(summary_max_bytes=budget.summary_max_bytes),
                              max_body_bytes=budget.api_json_body_limit)

    def check_hints(raw: Any, field: str) -> object:
        return scripted_hints(raw, budget, field=field)

    if naive:
        from hopline.scripted.naive import NAIVE

        return AgentSetup(standalone_model, check_hints, NAIVE)
    return AgentSetup(standalone_model, check_hints, BUDGETED)


def register(app: typer.Typer) -> None:
    @app.command()
    def agent() -> None:
        """Serve the harness as an ACP agent on stdin/stdout (protocol lines only on stdout)."""
        budget = budget_or_exit()
        naive = require_coherent_or_exit(budget, "agent")

        from hopline.harness.acp.fast_start import skip_unused_model_work

        skip_unused_model_work()  # before the ACP SDK is imported: a warm pool refills this fast
        from hopline.harness.acp.runtime import run_stdio

        raise typer.Exit(run_stdio(budget, offline_setup(budget, naive=naive)))
