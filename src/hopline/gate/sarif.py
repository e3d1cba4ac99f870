"""A gate run as SARIF 2.1.0: one run per gate agent, so code-scanning tools ingest it. Pure.

Each run names its tool ``hopline-gate/<agent>``, lists the rules its findings use, and carries one
result per finding (``level`` = the finding's severity; the location relative to ``SRCROOT``, the
repository's root). The invocation says whether the gate gave a verdict (``executionSuccessful``);
the verdict, the commits and the run's figures are in the run's ``properties``. Paths stay relative:
no absolute path of the machine is written.
"""

from __future__ import annotations

from typing import Any

from hopline import __version__

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "SRCROOT"


def _rule(rule_id: str, findings: list[dict[str, Any]]) -> dict[str, Any]:
    first = next(f for f in findings if f["rule"] == rule_id)
    return {"id": rule_id, "shortDescription": {"text": rule_id.replace("-", " ")},
            "defaultConfiguration": {"level": first["severity"]}}


def _result(finding: dict[str, Any], rule_index: int) -> dict[str, Any]:
    location: dict[str, Any] = {"artifactLocation": {"uri": finding["file"], "uriBaseId": SRCROOT}}
    if isinstance(finding.get("line"), int):
        location["region"] = {"startLine": finding["line"]}
    return {"ruleId": finding["rule"], "ruleIndex": rule_index, "level": finding["severity"],
            "message": {"text": finding["message"]}, "locations": [{"physicalLocation": location}]}


def gate_run_to_sarif(agent: dict[str, Any], *, base: str, head: str) -> dict[str, Any]:
    """One SARIF run of one gate agent's report (a row of :meth:`GateRun.to_json`'s ``agents``)."""
    findings: list[dict[str, Any]] = list(agent.get("findings") or [])
    rule_ids = sorted({f["rule"] for f in findings})
    index = {rule_id: i for i, rule_id in enumerate(rule_ids)}
    verdict = agent.get("verdict")
    invocation: dict[str, Any] = {"executionSuccessful": verdict in ("pass", "fail")}
    if verdict not in ("pass", "fail"):
        invocation["toolExecutionNotifications"] = [{
            "level": "error", "message": {"text": str(agent.get("summary") or "the gate gave no verdict")}}]
    return {
        "tool": {"driver": {"name": f"hopline-gate/{agent['agent']}", "version": __version__,
                            "rules": [_rule(r, findings) for r in rule_ids]}},
        "originalUriBaseIds": {SRCROOT: {"description": {"text": "the root of the reviewed repository"}}},
        "invocations": [invocation],
        "results": [_result(f, index[f["rule"]]) for f in findings],
        "properties": {"verdict": verdict, "summary": agent.get("summary") or "", "base": base,
                       "head": head, "iterations": agent.get("iterations", 0),
                       "compactions": agent.get("compactions", 0),
                       "omittedFindings": agent.get("omittedFindings", 0)},
    }


def to_sarif(result: dict[str, Any]) -> dict[str, Any]:
    """The SARIF log of a gate run's result (``GET /gate/{id}``): one run per gate agent."""
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION,
            "runs": [gate_run_to_sarif(agent, base=result["base"], head=result["head"])
                     for agent in result.get("agents") or []]}
