"""The `hopline` command line.

Each command lives in its own module of this package and exposes ``register(app)``; modules are
discovered here so that commands can be added without touching a shared list. Command modules
import their heavy dependencies inside the command function, so `hopline agent` starts fast.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(
    name="hopline",
    help="An agent server in which every hop has a declared, coordinated, measured byte budget.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from hopline import __version__

        typer.echo(f"hopline {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print hopline's version and exit.",
                                 is_eager=True, callback=_print_version),
) -> None:
    """An agent server in which every hop has a declared, coordinated, measured byte budget."""


def _register_commands() -> None:
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name.startswith("_"):
            continue
        importlib.import_module(f"{__name__}.{module.name}").register(app)


_register_commands()


def main() -> None:
    app()
