"""The one severity table of the gate: every rule a gate agent reports, hopline's own and the
analyzers' (ruff, detect-secrets, bandit, semgrep), with its severity, the agent whose domain it is,
what it means and where it is documented. Pure.

A row names one rule (``ruff/S602``) or a family by its prefix (``ruff/S``, ``detect-secrets/``);
the longest matching row wins. Its ``in_tests`` severity applies to a file under a tests folder (a
credential in a test fixture is a warning, not an error). Rows that share a ``concern`` on one line
are one finding: the first in the table's order is kept and names the others (ruff's ``S602`` and
bandit's ``B602`` are the same check; a Slack token is also a high-entropy string).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

CWE = "https://cwe.mitre.org/data/definitions/{}.html"
_RUFF_RULES = "https://docs.astral.sh/ruff/rules/"  # a finding of ruff carries its rule's own page
_DETECT_SECRETS_DOCS = "https://github.com/Yelp/detect-secrets#currently-supported-plugins"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One row: a rule id or a prefix of ids, and what the gate does with its findings."""

    rule: str
    agent: str
    severity: str  # error, warning, note
    description: str  # SARIF's fullDescription
    help_uri: str | None = None  # used when a finding carries no link of its own
    in_tests: str | None = None  # the severity in a test file, when lower
    security: str | None = None  # GitHub's security-severity (0.0-10.0), for security rules
    concern: str | None = None  # findings of one concern on one line are one finding
    levels: tuple[tuple[str, str], ...] = ()  # the analyzer's own level of a finding -> its severity


def _S(code: str, severity: str, what: str, *, agent: str = "appsec", security: str | None = "7.5",
       in_tests: str | None = None) -> Rule:
    """A row of one of ruff's flake8-bandit rules (the same check as bandit's ``B<nnn>``)."""
    return Rule(f"ruff/{code}", agent, severity, what, _RUFF_RULES, in_tests, security,
                f"bandit-{code[1:]}" if code[1:].isdigit() else None)


_PERF = "qa_performance_security"
_CREDENTIAL = {"in_tests": "warning", "security": "8.5"}  # a credential in a test fixture: a warning
RULES: tuple[Rule, ...] = (
    # --- hopline's own rules ---------------------------------------------------------------------
    Rule("test-failure", "qa_automation", "error", "A test log the change adds records a failing test.",
         "https://docs.pytest.org/en/stable/how-to/output.html"),
    Rule("test-failed", "qa_automation", "error", "A test the gate's test command ran fails at the head "
         "(a warning when it fails at the base too: the change did not introduce it).",
         "https://docs.pytest.org/en/stable/how-to/failures.html"),
    Rule("test-command-failed", "qa_automation", "error", "The gate's test command failed at the head and "
         "named no failing test.", "https://docs.pytest.org/en/stable/reference/exit-codes.html"),
    Rule("tests-did-not-run", "qa_automation", "error", "The gate's test command ran no test at the head (a "
         "module that does not import, no test runner, pytest's exit codes 2 to 5, Ran 0 tests), even when "
         "the base fails the same way: what was not run was not checked.",
         "https://docs.pytest.org/en/stable/reference/exit-codes.html"),
    Rule("test-removed", "qa_automation", "error", "A test the base ran is gone or skipped at the head (a "
         "warning when the change touches no source code).",
         "https://docs.pytest.org/en/stable/how-to/skipping.html"),
    Rule("compile-error", "qa_automation", "error", "A changed Python file does not compile.",
         "https://docs.python.org/3/library/py_compile.html"),
    Rule("process-limit", "qa_automation", "error", "A run started more processes than the sandbox allows "
         "(HOPLINE_SANDBOX_MAX_PROCESSES): its result is not the code's.", CWE.format(400), security="5.0"),
    Rule("unsafe-eval", _PERF, "error", "eval or exec in a source file that is not Python (ruff's S307 and "
         "S102 check Python): text run as code is unsafe with any input it does not fully control. A "
         "match in a comment or a string does not count.", CWE.format(95), security="8.0",
         concern="eval"),
    Rule("timing-unsafe-compare", "appsec", "error", "A digest, signature or MAC compared with == or !=: "
         "the comparison's time tells an attacker how much of a forged value is right. Compare with "
         "hmac.compare_digest.", CWE.format(208), security="6.5"),
    Rule("todo-added", "qa_strategy", "warning", "The change adds a TODO or FIXME: unfinished work ships "
         "with it.", CWE.format(546)),
    Rule("untested-change", "qa_strategy", "error", "Lines of source code the change adds that no test "
         "runs (coverage of the head's tests, as diff-cover). Where coverage cannot run: a warning, a source "
         "file changes and no test does.", "https://coverage.readthedocs.io/"),
    Rule("symlink-escape", "appsec", "error", "A symlink the change adds points out of the repository.",
         CWE.format(61), security="6.5"),
    # --- ruff: pyflakes (F), syntax errors (E9), flake8-bandit (S) ---------------------------------
    Rule("ruff/invalid-syntax", _PERF, "error", "ruff cannot parse the file: a syntax error.",
         "https://docs.astral.sh/ruff/linter/#error-suppression"),
    Rule("ruff/E9", _PERF, "error", "ruff: a syntax or I/O error reading the file.",
         "https://docs.astral.sh/ruff/rules/io-error/"),
    Rule("ruff/F", _PERF, "warning", "ruff (pyflakes): a likely mistake (an unused name, a redefinition).",
         _RUFF_RULES),
    Rule("ruff/F82", _PERF, "error", "ruff (pyflakes): an undefined name: the line fails when it runs.",
         _RUFF_RULES),
    Rule("ruff/F63", _PERF, "error", "ruff (pyflakes): a comparison or assert that is always true or false.",
         _RUFF_RULES),
    Rule("ruff/F70", _PERF, "error", "ruff (pyflakes): a statement outside the block it needs.", _RUFF_RULES),
    _S("S102", "error", "ruff: exec runs text as code.", agent=_PERF, security="8.0"),
    _S("S307", "error", "ruff: eval runs text as code; ast.literal_eval reads a literal.", agent=_PERF,
       security="8.0"),
    _S("S113", "warning", "ruff: an HTTP request without a timeout can hang forever.", agent=_PERF,
       security=None),
    _S("S110", "note", "ruff: try-except-pass hides every error.", agent=_PERF, security=None),
    _S("S112", "note", "ruff: try-except-continue hides every error.", agent=_PERF, security=None),
    Rule("ruff/S", "appsec", "error", "ruff (flake8-bandit): a security issue.", _RUFF_RULES, security="7.5"),
    _S("S104", "warning", "ruff: a server bound to every interface.", security="5.0"),
    _S("S105", "error", "ruff: a hard-coded password assigned to a variable.", **_CREDENTIAL),
    _S("S106", "error", "ruff: a hard-coded password passed as an argument.", **_CREDENTIAL),
    _S("S107", "error", "ruff: a hard-coded password as a default argument.", **_CREDENTIAL),
    _S("S108", "warning", "ruff: a hard-coded temporary file or directory.", security="5.0", in_tests="note"),
    _S("S311", "warning", "ruff: a pseudo-random generator, not for secrets.", security="5.0",
       in_tests="note"),
    _S("S4", "note", "ruff: an import of a module with unsafe uses (the uses are their own rules).",
       security=None),
    _S("S603", "note", "ruff: a subprocess call: check that its input is trusted.", security=None),
    _S("S607", "note", "ruff: a process started with a partial executable path.", security=None),
    # --- detect-secrets: a credential in any text file ------------------------------------------
    Rule("detect-secrets/", "appsec", "error", "detect-secrets: a credential in the change: it is public "
         "to everyone who can read the repository; revoke it and read it from a secret store.",
         _DETECT_SECRETS_DOCS, "warning", "8.5", "credential"),
    Rule("detect-secrets/Base64HighEntropyString", "appsec", "warning", "detect-secrets: a high-entropy "
         "string that may be a credential.", _DETECT_SECRETS_DOCS, "note", "5.0", "credential"),
    Rule("detect-secrets/HexHighEntropyString", "appsec", "warning", "detect-secrets: a high-entropy hex "
         "string that may be a credential.", _DETECT_SECRETS_DOCS, "note", "5.0", "credential"),
    Rule("detect-secrets/IPPublicDetector", "appsec", "note", "detect-secrets: a public IP address.",
         _DETECT_SECRETS_DOCS, concern="credential"),
    # --- bandit and semgrep, when installed ---------------------------------------------------------
    Rule("bandit/", "appsec", "error", "bandit: a security issue (of bandit's low severity: a warning).",
         "https://bandit.readthedocs.io/en/latest/plugins/index.html", security="7.5",
         levels=(("LOW", "warning"),)),
    Rule("semgrep/", "appsec", "error", "semgrep: a finding of the repository's own rules (.semgrep.yml; "
         "semgrep's WARNING: a warning, INFO: a note).", "https://semgrep.dev/docs/writing-rules/overview",
         security="7.5", levels=(("WARNING", "warning"), ("INFO", "note"))),
)
# ruff's credential rules are one concern with detect-secrets' on a line
_SAME_CONCERN = {**{f"{tool}{n}": "credential" for tool in ("ruff/S", "bandit/B") for n in (105, 106, 107)},
                 "ruff/S307": "eval", "ruff/S102": "eval", "bandit/B307": "eval", "bandit/B102": "eval"}
_BY_ID = {r.rule: r for r in RULES}
_RANK = {"error": 0, "warning": 1, "note": 2}
_FALLBACK = Rule("", "appsec", "warning", "a finding of a rule the gate's table does not list.")


def rule_of(rule_id: str) -> Rule:
    """The row of ``rule_id``: its own, else the longest prefix's, else a warning (appsec's). A
    check of bandit's is in the domain of the same check of ruff's (bandit's ``B307`` is ruff's
    ``S307``: qa_performance_security's eval), with bandit's row's severity and ruff's severity in
    tests (a temporary path in a test is a note under either linter)."""
    for end in range(len(rule_id), 0, -1):
        found = _BY_ID.get(rule_id[:end])
        if found is not None:
            break
    else:
        return _FALLBACK
    if (check := _BANDIT_CHECK.match(rule_id)) is not None and rule_id.startswith("bandit/"):
        same = rule_of(f"ruff/S{check.group(1)}")
        return dataclasses.replace(found, agent=same.agent, in_tests=same.in_tests or found.in_tests)
    return found


_BANDIT_CHECK = re.compile(r"^(?:ruff/S|bandit/B)(\d{3})$")
# Of one concern's findings of one severity, the one kept: the specialist's (a secret's type named
# by detect-secrets), then hopline's own, then ruff's (bandit's checks, in the linter a team runs).
_PRIORITY = ("detect-secrets/", "", "ruff/", "bandit/", "semgrep/")


def concern_of(rule_id: str) -> str | None:
    if rule_id in _SAME_CONCERN:
        return _SAME_CONCERN[rule_id]
    if (check := _BANDIT_CHECK.match(rule_id)) is not None:
        return f"bandit-{check.group(1)}"
    return rule_of(rule_id).concern


def _priority(finding: dict[str, Any]) -> tuple[int, int]:
    rule = str(finding.get("rule"))
    source = next((i for i, p in enumerate(_PRIORITY) if p and rule.startswith(p)),
                  1 if "/" not in rule else len(_PRIORITY))
    return _RANK.get(str(finding.get("severity")), 3), source


def severity_of(rule_id: str, *, tests: bool, said: str | None = None) -> str:
    """The table's severity of ``rule_id`` (``tests``: in a test file; ``said``: the analyzer's own
    level of the finding, for the rows that read it)."""
    row = rule_of(rule_id)
    severity = dict(row.levels).get(said or "", row.severity)
    if tests and row.in_tests is not None and _RANK[row.in_tests] > _RANK[severity]:
        return row.in_tests
    return severity


def one_per_concern(findings: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``findings`` with those of one concern on one line made one: the most severe (then the
    specialist's, see :data:`_PRIORITY`) is kept, and its message names the others' rule ids."""
    kept: list[dict[str, Any]] = []
    by_key: dict[tuple[str, Any, str], dict[str, Any]] = {}
    for finding in findings:
        concern = concern_of(str(finding.get("rule")))
        key = (str(finding.get("file")), finding.get("line"), concern or "")
        first = by_key.get(key) if concern is not None and finding.get("line") is not None else None
        if first is None:
            if concern is not None:
                by_key[key] = finding
            kept.append(finding)
            continue
        if _priority(finding) < _priority(first):
            first, finding = finding, first
            kept[kept.index(by_key[key])] = first
            by_key[key] = first
        also = re.search(r" \(also ([^()]*)\)$", str(first["message"]))
        names = [*(also.group(1).split(", ") if also else []), str(finding["rule"])]
        base = first["message"][:also.start()] if also else first["message"]
        first["message"] = f"{base} (also {', '.join(dict.fromkeys(names))})"
    return kept


def agents_rules(agent: str) -> list[str]:
    """hopline's own rules of ``agent`` (an analyzer's are named by the analyzer), for its summary."""
    return [r.rule for r in RULES if r.agent == agent and "/" not in r.rule]
