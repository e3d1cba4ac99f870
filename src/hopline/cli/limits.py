"""`hopline limits`: the hop table, the fixed values and the coherence findings (SPEC B-4); with
``--markdown``, the configuration reference (``docs/configuration.md``) from the defaults alone."""

from __future__ import annotations

import typer

from hopline.budget import (
    CEILINGS,
    FIXED,
    SETTINGS,
    Budget,
    CoherenceFinding,
    Settings,
    Unit,
    check_coherence,
    format_size,
    limits_json,
    reference_markdown,
)
from hopline.cli._common import budget_or_exit


def _human(unit: Unit, value: int | float) -> str:
    return format_size(int(value)) if unit is Unit.BYTES else unit.value


def _print_table(budget: Budget, findings: list[CoherenceFinding], settings: Settings) -> None:
    from rich.console import Console
    from rich.table import Table

    narrowest = budget.narrowest_request_ceiling().key
    table = Table(title="hopline budget", show_lines=False)
    for column in ("hop", "ceiling", "value", "human", "source", ""):
        table.add_column(column)
    for c in CEILINGS:
        value = budget.value(c.key)
        mark = "narrowest on the request path" if c.key == narrowest else ""
        table.add_row(c.hop, c.name, str(value), _human(c.unit, value), budget.source(c.key), mark)
    console = Console(width=160)
    console.print(table)
    fixed = Table(title="fixed (named constants, no settings: no variable changes them)", show_lines=False)
    for column in ("hop", "fixed value", "value", "human"):
        fixed.add_column(column)
    for c in FIXED:
        value = budget.value(c.key)
        fixed.add_row(c.hop, c.name, str(value), _human(c.unit, value))
    console.print(fixed)
    shown = Table(title="hopline settings (where state lives; several daemons)", show_lines=False)
    for column in ("setting", "option", "value", "source"):
        shown.add_column(column)
    for setting in SETTINGS:
        shown.add_row(setting.name, setting.option or "", settings.shown(setting.key),
                      settings.source(setting.key))
    console.print(shown)
    if not findings:
        console.print("coherent: no errors, no warnings")
    for f in findings:
        style = "bold red" if f.severity == "error" else "yellow"
        console.print(f"[{style}]{f.severity}[/] {f.rule}: {f.message}", markup=True,
                      highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def limits(
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        markdown: bool = typer.Option(False, "--markdown", help="Print the configuration reference (every "
                                      "variable, its default and bounds) from the defaults alone."),
    ) -> None:
        """Print every hop's ceiling, where it came from, the fixed values, and the coherence findings."""
        import orjson

        if markdown:  # the declarations alone: whatever the environment holds
            typer.echo(reference_markdown(), nl=False)
            return
        budget = budget_or_exit()
        settings = Settings.from_env()
        findings = check_coherence(budget)
        if as_json:
            typer.echo(orjson.dumps(limits_json(budget, findings, settings)).decode())
        else:
            _print_table(budget, findings, settings)
        if any(f.severity == "error" for f in findings):
            raise typer.Exit(1)
