"""A gate agent's verdict: its schema, and reading it from a final answer. Pure: no I/O.

The answer holds one JSON object (alone, or in a fenced ```json block: the last one wins)::

    {"verdict": "pass" | "fail" | "error", "summary": "...",
     "findings": [{"severity": "error" | "warning" | "note", "file": "path", "line": 12 | null,
                   "rule": "rule-id", "message": "..."}]}

Consistency rules: ``fail`` needs at least one ``error`` finding, ``pass`` has none. An answer that
does not parse or validate is :class:`VerdictInvalid` (the run asks once more, then records an
``error`` verdict: never a pass). Findings past ``HOPLINE_GATE_MAX_FINDINGS`` are counted as omitted.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hopline.budget import HoplineError

Severity = Literal["error", "warning", "note"]
_FENCED_RE = re.compile(r"```(?:json)?\s*\n(.*?)\n?```", re.DOTALL)
# An answer is read from its start up to this many characters (a verdict is small; a display bound).
MESSAGE_MAX_CHARS = 2000


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    severity: Severity
    file: Annotated[str, Field(min_length=1, max_length=1024)]
    line: Annotated[int, Field(ge=1)] | None = None
    rule: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-/]+$")]
    message: Annotated[str, Field(min_length=1, max_length=MESSAGE_MAX_CHARS)]


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: Literal["pass", "fail", "error"]
    summary: Annotated[str, Field(max_length=MESSAGE_MAX_CHARS)] = ""
    findings: list[Finding] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Verdict:
        errors = sum(1 for f in self.findings if f.severity == "error")
        if self.verdict == "fail" and errors == 0:
            raise ValueError("a fail verdict needs at least one finding of severity error")
        if self.verdict == "pass" and errors:
            raise ValueError(f"a pass verdict cannot carry {errors} findings of severity error")
        return self


# What the prompt shows the model (the schema of the answer, compactly).
VERDICT_FORMAT = ('{"verdict": "pass" | "fail" | "error", "summary": "one line", "findings": '
                  '[{"severity": "error" | "warning" | "note", "file": "path/in/repo", "line": 12, '
                  '"rule": "a-rule-id", "message": "what is wrong and why"}]}')


class VerdictInvalid(HoplineError, ValueError):
    """The answer holds no valid verdict; the message says why (never the answer itself)."""


@dataclasses.dataclass(frozen=True)
class ParsedVerdict:
    verdict: str
    summary: str
    findings: list[dict[str, Any]]
    omitted_findings: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "summary": self.summary, "findings": self.findings,
                "omittedFindings": self.omitted_findings}


def _candidates(text: str) -> list[str]:
    stripped = text.strip()
    blocks = [m.group(1) for m in _FENCED_RE.finditer(text)]
    return [*reversed(blocks), stripped]


def parse_verdict(text: str, *, max_findings: int) -> ParsedVerdict:
    """The verdict in a final answer, or :class:`VerdictInvalid` naming what was wrong."""
    reasons: list[str] = []
    for candidate in _candidates(text):
        try:
            raw = json.loads(candidate)
        except ValueError:
            continue
        if not isinstance(raw, dict):
            reasons.append("the JSON is not an object")
            continue
        findings = raw.get("findings")
        omitted = 0
        if isinstance(findings, list) and len(findings) > max_findings:
            omitted = len(findings) - max_findings
            # The verdict's consistency is judged on every finding; only the kept ones are reported.
            errors = [f for f in findings if isinstance(f, dict) and f.get("severity") == "error"]
            kept = (errors + [f for f in findings if f not in errors])[:max_findings]
            raw = {**raw, "findings": kept}
        try:
            verdict = Verdict.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "verdict"
            reasons.append(f"{where}: {first.get('msg')}")
            continue
        return ParsedVerdict(verdict.verdict, verdict.summary,
                             [f.model_dump() for f in verdict.findings], omitted)
    if not reasons:
        raise VerdictInvalid("the answer holds no JSON object (give the verdict as one JSON object)")
    raise VerdictInvalid("the verdict does not match the schema: " + "; ".join(reasons[:3]))


def error_verdict(reason: str) -> ParsedVerdict:
    """The verdict of a gate that gave none (stalled, failed, unparseable): ``error``, never pass."""
    return ParsedVerdict("error", reason[:MESSAGE_MAX_CHARS], [])
