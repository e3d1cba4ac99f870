"""What the gate's agents are asked (SPEC K-1): each gate agent's domain and its verdict's form, the
ask for a verdict once more, and the dev agent's fix prompt. Pure.

The first line of a gate prompt is machine-read by the offline reviewer
(:mod:`hopline.scripted.review`); the second names the test command the gate runs.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from hopline.gate.verdict import VERDICT_FORMAT
from hopline.harness.analyzers import analyzers_of
from hopline.vocabulary import FIX_MARKER, GATE_REVIEW_MARKER, TEST_COMMAND_MARKER

TITLES = {"qa_automation": "QA automation", "qa_performance_security": "QA performance and security",
          "qa_strategy": "QA strategy", "appsec": "application security"}
DOMAINS = {
    "qa_automation": "the tests of the change: compile the changed files, run the test command (at the head, "
                     "and at the base when the head fails, to tell apart the failures this change did not "
                     "introduce), read the test logs, and report every failing test with its file and line.",
    "qa_performance_security": "slow paths, resource leaks, unsafe input handling (text run as code, "
                               "as with eval or exec) and code that cannot run (syntax errors, undefined "
                               "names).",
    "qa_strategy": "test coverage and risk: changed code that no test covers, unfinished work (TODO, FIXME).",
    "appsec": "security: injection, unsafe deserialization, weak cryptography, secrets in any added file "
              "(tokens, keys, passwords), unsafe defaults.",
}


def analyzers_line(agent: str) -> str:
    """How ``agent`` runs its analyzers (none: the empty string): the commands, and what to keep."""
    analyzers = analyzers_of(agent)
    if not analyzers:
        return ""
    shown = "; ".join(f"`{a.commands(['FILES'])[0]}` ({'required' if a.required else 'when installed'}: "
                      f"{a.scope})" for a in analyzers)
    return ("Run your analyzers with run_command at the head: " + shown + ". git_diff added=true lists the "
            "lines the change adds: keep only the findings on those lines, each with the analyzer's rule id "
            "(ruff/S602, detect-secrets/GitHubTokenDetector, bandit/B602) and its documentation link as "
            "helpUri, and say in analyzers which ran; a required analyzer that is missing or fails makes "
            "your verdict error. A report longer than the tool-result cap is kept: read it with read_file "
            "as the marker says.\n")


def _header(agent: str, base: str, head: str) -> str:
    return f"{GATE_REVIEW_MARKER} · agent {agent} · base {base} · head {head}"


def test_command_line(test_command: dict[str, Any] | None) -> str:
    """The prompt's second line: the test command (``{"argv", "file"}``) as JSON, or null."""
    value = {"argv": list(test_command["argv"]), "file": test_command.get("file")} if test_command else None
    return f"{TEST_COMMAND_MARKER} {json.dumps(value)}"


def gate_prompt(agent: str, base: str, head: str, test_command: dict[str, Any] | None = None) -> str:
    """What a gate agent is asked: its domain, its tools, the test command, and the verdict's form."""
    shown = (f"The test command is `{shlex.join(test_command['argv'])}`: run_command runs it as it is "
             "(at='base' on the base commit)." if test_command
             else "No test command was found for this repository.")
    return (f"{_header(agent, base, head)}\n{test_command_line(test_command)}\n"
            f"{shown}\n"
            f"You are the {TITLES[agent]} gate of this pull request: {DOMAINS[agent]}\n"
            f"{analyzers_line(agent)}"
            "Review the change between base and head. git_diff with stat=true lists the changed files "
            "with their line counts, git_diff with path shows one file's diff, without arguments the "
            "whole diff. read_file, search_workspace and run_command (tests and linters only) let you "
            "look closer; the checkout is read-only.\n"
            f"End with your verdict as one JSON object in a ```json block, in this form:\n{VERDICT_FORMAT}\n"
            'verdict is "fail" when a finding has severity "error", "pass" otherwise, and "error" only '
            "when you could not review the change; file is relative to the repository's root.")


def verdict_retry_prompt(agent: str, base: str, head: str, reason: str) -> str:
    return (f"{_header(agent, base, head)}\nYour last answer held no valid verdict ({reason}). Answer "
            f"again with only your verdict, as one JSON object in a ```json block:\n{VERDICT_FORMAT}")


def fix_prompt(round_number: int, findings: list[dict[str, Any]],
               test_command: dict[str, Any] | None = None) -> str:
    """The dev agent's one prompt after a round with a fail: the test command (the second line, as
    in a gate prompt), the findings to fix, as JSON."""
    shown = (f"Then run the tests with run_command `{shlex.join(test_command['argv'])}` and"
             if test_command else "Then")
    return (f"{FIX_MARKER} · round {round_number}\n{test_command_line(test_command)}\nThe gate reviewed "
            "your change and found the issues below. Fix them in this checkout with write_file (paths "
            f"relative to its root). {shown} say what you changed and what you could not fix. "
            "run_command runs in the gate's sandbox: no network, the checkout the only writable place "
            "besides a private /tmp.\n"
            f"```json\n{json.dumps(findings, indent=1)}\n```")
