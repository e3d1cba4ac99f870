"""`hopline agent`: the harness served as an ACP agent on stdio (SPEC H-10)."""

from __future__ import annotations

import typer

from hopline.cli._common import budget_or_exit


def register(app: typer.Typer) -> None:
    @app.command()
    def agent() -> None:
        """Serve the harness as an ACP agent on stdin/stdout (protocol lines only on stdout)."""
        import sys

        from hopline.budget import IncoherentBudget, require_coherent

        budget = budget_or_exit()
        try:
            require_coherent(budget)
        except IncoherentBudget as exc:
            for finding in exc.errors:
                print(f"hopline agent: incoherent budget: {finding.rule}: {finding.message}", file=sys.stderr)
            raise typer.Exit(2) from None

        from hopline.harness.acp.runtime import run_stdio

        raise typer.Exit(run_stdio(budget))
