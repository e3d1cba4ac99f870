"""Reading a verdict from a final answer: the schema, its consistency rules, the findings ceiling."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hopline.budget import Budget
from hopline.gate.verdict import VerdictInvalid, cut_text, error_verdict, kept_findings, parse_verdict

ERROR = {"severity": "error", "file": "src/a.py", "line": 3, "rule": "unsafe-eval", "message": "eval"}
NOTE = {"severity": "note", "file": "README.md", "line": None, "rule": "style", "message": "wording"}
BUDGET = Budget.defaults().replace(gate_max_findings=10)
THREE = Budget.defaults().replace(gate_max_findings=3)


def answer(verdict: Any) -> str:
    return f"Here is my review.\n\n```json\n{json.dumps(verdict)}\n```\n"


def test_a_fenced_verdict_is_read_and_the_last_block_wins() -> None:
    text = answer({"verdict": "pass", "findings": []}) + answer({"verdict": "fail", "findings": [ERROR]})
    parsed = parse_verdict(text, BUDGET)
    assert parsed.verdict == "fail" and parsed.findings == [ERROR] and parsed.omitted_findings == 0
    whole = parse_verdict(json.dumps({"verdict": "pass", "findings": [NOTE]}), BUDGET)
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
        parse_verdict(text, BUDGET)


def test_findings_at_the_ceiling_are_kept_and_one_over_is_counted_as_omitted() -> None:
    notes = [{**NOTE, "message": f"n{i}"} for i in range(4)]
    at_limit = parse_verdict(answer({"verdict": "fail", "findings": [*notes[:2], ERROR]}), THREE)
    assert len(at_limit.findings) == 3 and at_limit.omitted_findings == 0
    over = parse_verdict(answer({"verdict": "fail", "findings": [*notes[:3], ERROR]}), THREE)
    # the error finding is kept first: the verdict stays consistent with what is reported
    assert over.omitted_findings == 1 and over.findings[0] == ERROR and len(over.findings) == 3


class CountedFinding(dict[str, Any]):
    """A finding that counts how often it is compared (the old split compared every pair)."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        CountedFinding.comparisons += 1
        return dict.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]


def test_the_kept_findings_are_chosen_in_one_pass_without_comparing_findings() -> None:
    findings = [CountedFinding({**(ERROR if i % 2 else NOTE), "message": f"m{i}"}) for i in range(2000)]
    CountedFinding.comparisons = 0
    kept = kept_findings(findings, 200)
    assert CountedFinding.comparisons == 0  # the old `f not in errors` made about 1,000,000
    assert len(kept) == 200 and all(f["severity"] == "error" for f in kept)
    assert kept == [f for f in findings if f["severity"] == "error"][:200]
    few = kept_findings(findings[:3], 2)  # fewer errors than room: the others follow, in order
    assert [f["message"] for f in few] == ["m1", "m0"]
    assert [f["message"] for f in kept_findings([findings[0], findings[1]], 2)] == ["m0", "m1"]


def test_a_verdict_with_150000_findings_parses_in_linear_work() -> None:
    """12 MB of findings, all errors: the old split (quadratic) took minutes on it; this is one pass
    over the list, then the 200 kept (HOPLINE_GATE_MAX_FINDINGS) are validated."""
    findings = [{**ERROR, "line": i + 1, "message": f"eval number {i}"} for i in range(150_000)]
    text = answer({"verdict": "fail", "summary": "many", "findings": findings})
    assert len(text) > 12_000_000
    parsed = parse_verdict(text, Budget.defaults())
    assert parsed.verdict == "fail" and parsed.omitted_findings == 150_000 - 200
    assert [f["line"] for f in parsed.findings] == list(range(1, 201))


def test_a_message_at_its_ceiling_is_kept_and_one_character_over_is_cut_saying_so() -> None:
    limit = BUDGET.gate_message_max_chars
    exact = {**ERROR, "message": "m" * limit}
    at_limit = parse_verdict(answer({"verdict": "fail", "findings": [exact]}), BUDGET)
    assert at_limit.findings[0]["message"] == "m" * limit
    over = parse_verdict(answer({"verdict": "fail", "summary": "s" * (limit + 1),
                                 "findings": [{**ERROR, "message": "m" * (limit + 1)}]}), BUDGET)
    message = over.findings[0]["message"]  # the verdict stands, its message is cut
    assert len(message) == limit and message.startswith("m" * 1900)
    assert message.endswith(f" … ({limit + 1} characters in all)")
    assert len(over.summary) == limit and over.summary.endswith(f"({limit + 1} characters in all)")
    small = Budget.defaults().replace(gate_message_max_chars=64)
    assert len(error_verdict("r" * 100, small).summary) == 64
    assert cut_text("x" * 64, 64) == "x" * 64


@pytest.mark.parametrize(("field", "key"), [("file", "gate_finding_file_max_chars"),
                                            ("rule", "gate_finding_rule_max_chars")])
def test_a_file_or_rule_at_its_ceiling_is_valid_and_one_character_over_is_not(field: str, key: str) -> None:
    limit = int(BUDGET.value(key))
    at_limit = parse_verdict(answer({"verdict": "fail", "findings": [{**ERROR, field: "a" * limit}]}), BUDGET)
    assert at_limit.findings[0][field] == "a" * limit
    with pytest.raises(VerdictInvalid, match=f"findings.0.{field}: .*{limit + 1} characters, over the limit "
                                             f"of {limit} \\({key.upper()}\\)"):
        parse_verdict(answer({"verdict": "fail", "findings": [{**ERROR, field: "a" * (limit + 1)}]}), BUDGET)
