"""Helpers shared by the commands: reading the budget with a clear startup error."""

from __future__ import annotations

import sys

import typer

from hopline.budget import Budget, BudgetError


def budget_or_exit() -> Budget:
    """The budget from the environment; a bad setting exits 2 with the variable named."""
    try:
        return Budget.from_env()
    except BudgetError as exc:
        print(f"hopline: bad setting: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
