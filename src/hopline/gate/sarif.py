"""A gate run as SARIF 2.1.0: one run per gate agent, so code-scanning tools ingest it. Pure.

Each run names its tool ``hopline-gate/<agent>`` (and the analyzers its agent ran as the tool's
``extensions``), lists the rules its findings use, each with the severity table's description
(``fullDescription``) and a documentation link (``helpUri``: the analyzer's, else the table's), and
carries one result per finding (``level`` = the finding's severity; the location relative to
``SRCROOT``, the repository's root, always with a region: a finding that names no line is at line
1). The invocation says whether the gate gave a verdict and ran its tests (``executionSuccessful``:
false when the test command ran no test at the head), and names the test command it ran with every
run's counts; the verdict, the commits and the run's figures are in the run's ``properties``. Paths
stay relative: no absolute path of the machine is written.

For GitHub code scanning: each result has ``partialFingerprints`` (a hash of the agent, rule, file
and message with its numbers taken out: the same finding keeps it when lines move), each security
rule ``properties["security-severity"]``, and each run ``automationDetails.id``
(``hopline-gate/<agent>/<gate run id>``: the category, then the run).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from hopline import __version__
from hopline.harness.analyzers import BY_NAME
from hopline.harness.rules import rule_of

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "SRCROOT"
FINGERPRINT_KEY = "hoplineFinding/v1"
HOPLINE_DOCS = "https://cwe.mitre.org/data/definitions/1000.html"  # a rule no row documents


def _rule(rule_id: str, findings: list[dict[str, Any]]) -> dict[str, Any]:
    first = next(f for f in findings if f["rule"] == rule_id)
    row = rule_of(rule_id)
    link = next((f["helpUri"] for f in findings if f["rule"] == rule_id and f.get("helpUri")), None)
    rule: dict[str, Any] = {"id": rule_id, "shortDescription": {"text": rule_id.replace("-", " ")},
                            "fullDescription": {"text": _described(rule_id, first, row.description)},
                            "helpUri": link or row.help_uri or HOPLINE_DOCS,
                            "help": {"text": f"{row.description} Severity: {row.severity}" + (
                                f" ({row.in_tests} in a test file)." if row.in_tests else ".")},
                            "defaultConfiguration": {"level": first["severity"]}}
    if row.security is not None:
        # GitHub's scale: over 9.0 critical, 7.0 to 8.9 high, 4.0 to 6.9 medium.
        rule["properties"] = {"security-severity": row.security, "tags": ["security"]}
    return rule


def _described(rule_id: str, first: dict[str, Any], description: str) -> str:
    """An analyzer's rule: what the analyzer says of it (its first finding's message), then the
    table's row; hopline's own: the row."""
    if "/" not in rule_id:
        return description
    said = re.sub(r" \(also [^()]*\)$", "", " ".join(str(first.get("message")).split()))
    return f"{rule_id}: {said}. {description}"


def fingerprint(agent: str, finding: dict[str, Any]) -> str:
    """A finding's identity that outlives a line move: no line number, no number in its message."""
    message = re.sub(r"\d+", "N", " ".join(str(finding.get("message")).split()))
    key = "\0".join((agent, str(finding.get("rule")), str(finding.get("file")), message))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def _result(finding: dict[str, Any], rule_index: int, finding_print: str) -> dict[str, Any]:
    region: dict[str, Any] = {"startLine": finding["line"] if isinstance(finding.get("line"), int) else 1}
    if isinstance(finding.get("column"), int):
        region["startColumn"] = finding["column"]
    if isinstance(finding.get("endLine"), int):
        region["endLine"] = finding["endLine"]
    location: dict[str, Any] = {"artifactLocation": {"uri": finding["file"], "uriBaseId": SRCROOT},
                                "region": region}
    return {"ruleId": finding["rule"], "ruleIndex": rule_index, "level": finding["severity"],
            "message": {"text": finding["message"]}, "locations": [{"physicalLocation": location}],
            "partialFingerprints": {FINGERPRINT_KEY: finding_print}}


def gate_run_to_sarif(agent: dict[str, Any], *, base: str, head: str, gate_id: str = "") -> dict[str, Any]:
    """One SARIF run of one gate agent's report (a row of :meth:`GateRun.to_json`'s ``agents``)."""
    findings: list[dict[str, Any]] = list(agent.get("findings") or [])
    rule_ids = sorted({f["rule"] for f in findings})
    index = {rule_id: i for i, rule_id in enumerate(rule_ids)}
    invocation = _invocation(agent)
    verdict = agent.get("verdict")
    return {
        "tool": {"driver": {"name": f"hopline-gate/{agent['agent']}", "version": __version__,
                            "rules": [_rule(r, findings) for r in rule_ids]},
                 "extensions": [_extension(a) for a in agent.get("analyzers") or []
                                if a.get("status") == "ran"]},
        "originalUriBaseIds": {SRCROOT: {"description": {"text": "the root of the reviewed repository"}}},
        "invocations": [invocation],
        "automationDetails": {"id": f"hopline-gate/{agent['agent']}/{gate_id}"},
        "results": [_result(f, index[f["rule"]], p)
                    for f, p in zip(findings, _prints(agent["agent"], findings), strict=True)],
        "properties": {"verdict": verdict, "summary": agent.get("summary") or "", "base": base,
                       "head": head, "iterations": agent.get("iterations", 0),
                       "compactions": agent.get("compactions", 0),
                       "omittedFindings": agent.get("omittedFindings", 0)},
    }


def _extension(analyzer: dict[str, Any]) -> dict[str, Any]:
    """An analyzer the agent ran, as a SARIF tool extension."""
    known = BY_NAME.get(str(analyzer.get("name")))
    out: dict[str, Any] = {"name": str(analyzer.get("name")),
                           "properties": {"files": analyzer.get("files", 0),
                                          "findings": analyzer.get("findings", 0)}}
    if known is not None:
        out["informationUri"] = known.docs
    return out


def _invocation(agent: dict[str, Any]) -> dict[str, Any]:
    """Whether the agent did what it had to: a verdict, and its tests run at the head (a run of the
    test command that ran no test is not a success, whatever the verdict); the test command it ran
    at the head and every run's counts."""
    verdict = agent.get("verdict")
    runs = [r for r in agent.get("testRuns") or [] if isinstance(r, dict)]
    unrun = [r for r in runs if r.get("at") == "head" and (r.get("ran") is False or r.get("timedOut"))]
    invocation: dict[str, Any] = {"executionSuccessful": verdict in ("pass", "fail") and not unrun}
    notes = [] if verdict in ("pass", "fail") else [str(agent.get("summary") or "the gate gave no verdict")]
    notes += [f"the tests did not run at the head ({r.get('command')}): "
              + ("killed at their timeout" if r.get("timedOut") else str(r.get("didNotRun"))) for r in unrun]
    if notes:
        invocation["toolExecutionNotifications"] = [{"level": "error", "message": {"text": text}}
                                                    for text in notes]
    head = next((r for r in reversed(runs) if r.get("at") == "head" and not r.get("coverage")), None)
    head = head or next((r for r in reversed(runs) if r.get("at") == "head"), None)
    if head is not None:
        invocation["commandLine"] = str(head.get("command"))
        if isinstance(head.get("exitCode"), int):
            invocation["exitCode"] = head["exitCode"]
        invocation["properties"] = {"testRuns": [
            {k: r.get(k) for k in ("at", "command", "coverage", "exitCode", "ran", "didNotRun", "counts",
                                   "summary")} for r in runs]}
    return invocation


def _prints(agent: str, findings: list[dict[str, Any]]) -> list[str]:
    """Each finding's fingerprint; the second of two alike gets ``:2`` (a fingerprint is one result)."""
    seen: dict[str, int] = {}
    out = []
    for finding in findings:
        value = fingerprint(agent, finding)
        seen[value] = seen.get(value, 0) + 1
        out.append(value if seen[value] == 1 else f"{value}:{seen[value]}")
    return out


def to_sarif(result: Mapping[str, Any]) -> dict[str, Any]:
    """The SARIF log of a gate run's result (``GET /gate/{id}``): one run per gate agent."""
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION,
            "runs": [gate_run_to_sarif(agent, base=result["base"], head=result["head"],
                                       gate_id=str(result.get("gateId") or ""))
                     for agent in result.get("agents") or []]}
