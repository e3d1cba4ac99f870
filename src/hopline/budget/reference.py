"""The configuration reference (``hopline limits --markdown``, ``docs/configuration.md``), written
from the declarations alone: every variable hopline reads, its default, bounds and what it does,
whatever the environment holds."""

from __future__ import annotations

from collections.abc import Sequence

from hopline.budget.ceiling import Ceiling
from hopline.budget.environment import shown_value
from hopline.budget.hops import HOP_MODELS
from hopline.budget.settings import SETTINGS
from hopline.budget.table import CEILINGS, FIXED
from hopline.budget.variables import VARIABLES

_INTRO = """\
# Configuration

hopline reads its configuration from the environment variables below, each declared once in
`src/hopline/budget/` (a hop's limits: `hops/`, the URLs and the cluster's token: `settings.py`, the
other variables: `variables.py`). This page is `hopline limits --markdown`, printed from the defaults
alone; `hopline limits` shows the values in force and where each came from, and checks that they
agree with one another (SPEC B-4).

A byte size is a number of bytes or a number with a 1024-based unit (`10mb` = `10MiB` = 10485760).
An empty variable is its default. A `HOPLINE_*` variable that names no setting, and a fixed value's
name, get a warning that they are ignored."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(header: tuple[str, ...], rows: Sequence[Sequence[str]]) -> list[str]:
    return [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}",
            *(f"| {' | '.join(_cell(cell) for cell in row)} |" for row in rows)]


def _bounds(c: Ceiling) -> str:
    low = shown_value(c, c.minimum)
    return f"{low} to {shown_value(c, c.maximum)}" if c.maximum is not None else f"at least {low}"


def _default(c: Ceiling) -> str:
    return shown_value(c, c.default)


def common_table() -> list[str]:
    """The few variables a person sets (the README shows this table too)."""
    rows = [(f"`{v.name}`", v.default or "-", v.description) for v in VARIABLES if v.common]
    rows += [(f"`{s.env}`", "-", s.description) for s in SETTINGS if s.common]
    rows += [(f"`{c.name}`", _default(c), c.description) for c in CEILINGS if c.common]
    return _table(("variable", "default", "what it does"), rows)


def reference_markdown() -> str:
    lines = [_INTRO, "", "## What you set", "", *common_table(), "", "## Settings", "",
             "### Where state lives, and several daemons", ""]
    lines += _table(("variable", "option", "what it does"),
                    [(f"`{s.env}`", f"`{s.option}`" if s.option else "-",
                      s.description + (" (a secret: never shown)" if s.secret else "")) for s in SETTINGS])
    lines += ["", "### The provider, the tokens, the data directory and the switches", ""]
    lines += _table(("variable", "default", "what it does"),
                    [(f"`{v.name}`", v.default or "-", v.description) for v in VARIABLES if v.by == "you"])
    lines += ["", "## Limits, hop by hop", "",
              "Each bounds one hop. Past it, the hop refuses with hopline's one limit error, which names "
              "the hop,", "the variable, the limit and what it saw.", ""]
    for model in HOP_MODELS:
        rows = [c for c in CEILINGS if c.hop == model.hop]
        doc = " ".join((model.__doc__ or "").split())
        where = f"`{model.__name__}`, `src/hopline/budget/hops/{model.__module__.rsplit('.', 1)[-1]}.py`"
        lines += [f"### `{model.hop}`", "", f"{doc} ({where})", ""]
        lines += _table(("variable", "default", "bounds", "what it bounds"),
                        [(f"`{c.name}`", _default(c), _bounds(c), c.description) for c in rows])
        lines.append("")
    lines += ["## Fixed values", "",
              "Named constants of their hop, no settings: no variable reads them, `hopline limits` lists "
              "them under", "\"fixed\", and their name set in the environment gets a warning that it is "
              "ignored.", ""]
    lines += _table(("name", "value", "hop", "what it is"),
                    [(f"`{c.name}`", _default(c), f"`{c.hop}`", c.description) for c in FIXED])
    lines += ["", "## Set by hopline for the processes it starts", ""]
    lines += _table(("variable", "what it carries"),
                    [(f"`{v.name}`", v.description) for v in VARIABLES if v.by == "hopline"])
    return "\n".join(lines) + "\n"

