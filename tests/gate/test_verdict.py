"""Reading a verdict from a final answer: the schema, its consistency rules, the findings ceiling."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hopline.gate.verdict import VerdictInvalid, parse_verdict

ERROR = {"severity": "error", "file": "src/a.py", "line": 3, "rule": "unsafe-eval", "message": "eval"}
NOTE = {"severity": "note", "file": "README.md", "line": None, "rule": "style", "message": "wording"}


def answer(verdict: Any) -> str:
    return f"Here is my review.\n\n```json\n{json.dumps(verdict)}\n```\n"


def test_a_fenced_verdict_is_read_and_the_last_block_wins() -> None:
    text = answer({"verdict": "pass", "findings": []}) + answer({"verdict": "fail", "findings": [ERROR]})
    parsed = parse_verdict(text, max_findings=10)
    assert parsed.verdict == "fail" and parsed.findings == [ERROR] and parsed.omitted_findings == 0
    whole = parse_verdict(json.dumps({"verdict": "pass", "findings": [NOTE]}), max_findings=10)
    assert whole.verdict == "pass"


@pytest.mark.parametrize(("text", "why"), [
    ("It looks fine to me.", "holds no JSON object"),
    ("```json\n{\"verdict\": \"pass\", \"findings\": [\n```", "holds no JSON object"),
    (answer(["pass"]), "not an object"),
    (answer({"verdict": "ok", "findings": []}), "verdict"),
    (answer({"verdict": "pass", "findings": "none"}), "findings"),
    (answer({"verdict": "pass", "findings": [], "score": 3}), "score"),
    (answer({"verdict": "fail", "findings": [{**ERROR, "severity": "critical"}]}), "severity"),
    (answer({"verdict": "fail", "findings": [{**ERROR, "line": 0}]}), "line"),
    (answer({"verdict": "fail", "findings": [NOTE]}), "a fail verdict needs at least one"),
    (answer({"verdict": "pass", "findings": [ERROR]}), "a pass verdict cannot carry 1"),
])
def test_an_answer_without_a_valid_verdict_is_refused_naming_why(text: str, why: str) -> None:
    with pytest.raises(VerdictInvalid, match=why):
        parse_verdict(text, max_findings=10)


def test_findings_at_the_ceiling_are_kept_and_one_over_is_counted_as_omitted() -> None:
    notes = [{**NOTE, "message": f"n{i}"} for i in range(4)]
    at_limit = parse_verdict(answer({"verdict": "fail", "findings": [*notes[:2], ERROR]}), max_findings=3)
    assert len(at_limit.findings) == 3 and at_limit.omitted_findings == 0
    over = parse_verdict(answer({"verdict": "fail", "findings": [*notes[:3], ERROR]}), max_findings=3)
    # the error finding is kept first: the verdict stays consistent with what is reported
    assert over.omitted_findings == 1 and over.findings[0] == ERROR and len(over.findings) == 3
