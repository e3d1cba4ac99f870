"""`hopline agent`: the harness served as an ACP agent on stdio (SPEC H-10)."""

from __future__ import annotations

import typer

from hopline.cli._common import budget_or_exit, require_coherent_or_exit


def register(app: typer.Typer) -> None:
    @app.command()
    def agent() -> None:
        """Serve the harness as an ACP agent on stdin/stdout (protocol lines only on stdout)."""
        budget = budget_or_exit()
        naive = require_coherent_or_exit(budget, "agent")

        from hopline.harness.acp.fast_start import skip_unused_model_work

        skip_unused_model_work()  # before the ACP SDK is imported: a warm pool refills this fast
        from hopline.harness.acp.runtime import run_stdio

        raise typer.Exit(run_stdio(budget, naive=naive))
