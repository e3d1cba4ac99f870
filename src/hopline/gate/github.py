"""A gate run as GitHub Actions workflow commands: one annotation per finding of its last round, on
its file and line in the pull request's "Files changed" view. Pure.

``::error file=src/a.py,line=12,col=5,endLine=12,title=appsec/ruff/S602::message``: the finding's
severity picks the command (``error``, ``warning``, ``notice`` for a note); a finding with no line
is annotated on its file. Values are escaped as the runner reads them (``%``, CR and LF everywhere;
``:`` and ``,`` in properties too), so a message cannot end the command or add a property.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_COMMANDS = {"error": "error", "warning": "warning", "note": "notice"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(agent: str, finding: dict[str, Any]) -> str:
    """One finding as a workflow command."""
    props = [f"file={_property(str(finding.get('file')))}"]
    for key, name in (("line", "line"), ("column", "col"), ("endLine", "endLine")):
        if isinstance(finding.get(key), int):
            props.append(f"{name}={finding[key]}")
    props.append(f"title={_property(agent + '/' + str(finding.get('rule')))}")
    message = " ".join(str(finding.get("message")).split())
    if finding.get("helpUri"):
        message += f" ({finding['helpUri']})"
    return f"::{_COMMANDS.get(str(finding.get('severity')), 'warning')} {','.join(props)}::{_data(message)}"


def annotate(result: Mapping[str, Any]) -> list[str]:
    """Every finding of the run's last round (``GET /gate/{id}``'s ``agents``), as workflow commands,
    and one per gate that gave no verdict (an ``error``: it could not review the change)."""
    out = []
    for agent in result.get("agents") or []:
        name = str(agent.get("agent"))
        out += [annotation(name, f) for f in agent.get("findings") or []]
        if agent.get("verdict") not in ("pass", "fail"):
            said = " ".join(str(agent.get("summary")).split())
            out.append(f"::error title={_property(name)}::{_data(said)}")
    return out
