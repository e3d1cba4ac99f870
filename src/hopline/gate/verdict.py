"""A gate agent's verdict: its schema, and reading it from a final answer. Pure: no I/O.

The answer holds one JSON object (alone, or in a fenced ```json block: the last one wins)::

    {"verdict": "pass" | "fail" | "error", "summary": "...",
     "findings": [{"severity": "error" | "warning" | "note", "file": "path", "line": 12 | null,
                   "rule": "rule-id", "message": "...",
                   "column": 5, "endLine": 12, "helpUri": "https://..."}],   # these three optional
     "analyzers": [{"name": "ruff", "status": "ran" | "missing" | "failed" | "pending",
                    "files": 3, "findings": 1}]}                              # optional

Consistency rules: ``fail`` needs at least one ``error`` finding, ``pass`` has none. An answer that
does not parse or validate is :class:`VerdictInvalid` (the run asks once more, then records an
``error`` verdict: never a pass). The budget bounds the work before any validation: findings past
``HOPLINE_GATE_MAX_FINDINGS`` are counted as omitted (errors are kept first, in one pass), and only
the kept ones are validated. A message or summary longer than ``HOPLINE_GATE_MESSAGE_MAX_CHARS`` is
cut (saying how long it was): a long message is no reason to lose the verdict. A ``file`` or ``rule``
past its ceiling is invalid (cut, it would name something else).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.errors import AgentError

Severity = Literal["error", "warning", "note"]
_FENCED_RE = re.compile(r"```(?:json)?\s*\n(.*?)\n?```", re.DOTALL)


def cut_text(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters; else its head and a marker saying how long
    it was, ``limit`` characters in all."""
    if len(text) <= limit:
        return text
    marker = f" … ({len(text)} characters in all)"  # shorter than the ceiling's minimum (64)
    return text[:limit - len(marker)] + marker


def _budget(info: ValidationInfo) -> Budget:
    """The budget a verdict is validated with (:func:`parse_verdict` passes it as the context)."""
    budget: Budget = (info.context or {})["budget"]
    return budget


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    severity: Severity
    file: Annotated[str, Field(min_length=1)]
    line: Annotated[int, Field(ge=1)] | None = None
    rule: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-/]+$")]
    message: Annotated[str, Field(min_length=1)]
    column: Annotated[int, Field(ge=1)] | None = None
    endLine: Annotated[int, Field(ge=1)] | None = None
    helpUri: Annotated[str, Field(pattern=r"^https://\S+$", max_length=400)] | None = None

    @field_validator("file", "rule", mode="before")
    @classmethod
    def _within_ceiling(cls, value: Any, info: ValidationInfo) -> Any:
        key = f"gate_finding_{info.field_name}_max_chars"
        limit = int(_budget(info).value(key))
        if isinstance(value, str) and len(value) > limit:
            setting = CEILINGS_BY_KEY[key].name
            raise ValueError(f"{len(value)} characters, over the limit of {limit} ({setting})")
        return value

    @field_validator("message")
    @classmethod
    def _cut_message(cls, value: str, info: ValidationInfo) -> str:
        return cut_text(value, _budget(info).gate_message_max_chars)


class AnalyzerRun(BaseModel):
    """One analyzer an agent ran (or could not): what a verdict says of its tools."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    status: Literal["ran", "missing", "failed", "pending"]
    files: Annotated[int, Field(ge=0)] = 0
    findings: Annotated[int, Field(ge=0)] = 0


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: Literal["pass", "fail", "error"]
    summary: str = ""
    findings: list[Finding] = Field(default_factory=list)
    analyzers: Annotated[list[AnalyzerRun], Field(max_length=16)] = Field(default_factory=list)

    @field_validator("summary")
    @classmethod
    def _cut_summary(cls, value: str, info: ValidationInfo) -> str:
        return cut_text(value, _budget(info).gate_message_max_chars)

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
                  '"rule": "a-rule-id", "message": "what is wrong and why", "column": 5, '
                  '"helpUri": "https://the analyzer\'s documentation of the rule"}], '
                  '"analyzers": [{"name": "ruff", "status": "ran" | "missing" | "failed", "files": 3, '
                  '"findings": 1}]} (column, helpUri and analyzers are optional)')


class VerdictInvalid(AgentError, ValueError):
    """The answer holds no valid verdict; the message says why (never the answer itself)."""


@dataclasses.dataclass(frozen=True)
class ParsedVerdict:
    verdict: str
    summary: str
    findings: list[dict[str, Any]]
    omitted_findings: int = 0
    analyzers: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "summary": self.summary, "findings": self.findings,
                "omittedFindings": self.omitted_findings, "analyzers": self.analyzers}


def _candidates(text: str) -> list[str]:
    stripped = text.strip()
    blocks = [m.group(1) for m in _FENCED_RE.finditer(text)]
    return [*reversed(blocks), stripped]


def kept_findings(findings: list[Any], max_findings: int) -> list[Any]:
    """At most ``max_findings`` of ``findings``, those of severity ``error`` first (so the verdict's
    consistency, judged on what is kept, is that of the whole list): one pass, no comparison."""
    if len(findings) <= max_findings:
        return findings
    errors: list[Any] = []
    others: list[Any] = []
    for finding in findings:
        is_error = isinstance(finding, dict) and finding.get("severity") == "error"
        (errors if is_error else others).append(finding)
    return (errors + others[:max(0, max_findings - len(errors))])[:max_findings]


def parse_verdict(text: str, budget: Budget) -> ParsedVerdict:
    """The verdict in a final answer, or :class:`VerdictInvalid` naming what was wrong. Linear in
    the answer's size; blocking for a large answer (the gate run calls it off the event loop)."""
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
        if isinstance(findings, list) and len(findings) > budget.gate_max_findings:
            omitted = len(findings) - budget.gate_max_findings
            raw = {**raw, "findings": kept_findings(findings, budget.gate_max_findings)}
        try:
            verdict = Verdict.model_validate(raw, context={"budget": budget})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "verdict"
            reasons.append(f"{where}: {first.get('msg')}")
            continue
        return ParsedVerdict(verdict.verdict, verdict.summary,
                             [{k: v for k, v in f.model_dump().items() if v is not None or k == "line"}
                              for f in verdict.findings], omitted,
                             [a.model_dump() for a in verdict.analyzers])
    if not reasons:
        raise VerdictInvalid("the answer holds no JSON object (give the verdict as one JSON object)")
    raise VerdictInvalid("the verdict does not match the schema: " + "; ".join(reasons[:3]))


def error_verdict(reason: str, budget: Budget) -> ParsedVerdict:
    """The verdict of a gate that gave none (stalled, failed, unparseable): ``error``, never pass."""
    return ParsedVerdict("error", cut_text(reason, budget.gate_message_max_chars), [])
