"""What a run of the gate's test command says after its output: the same facts twice, structured for a
program (the tool message's ``_meta["hopline.tests"]``) and in lines for a model, each bounded."""

from __future__ import annotations

from typing import Any

from hopline.harness.testruns import FAILED_KEPT
from hopline.harness.tools import coverage_run
from hopline.harness.tools.reviewing import ReviewRun

REMOVED_KEPT = 20  # removed tests a record names (the count is whole)


def tests_record(review: ReviewRun) -> dict[str, Any] | None:
    """``_meta["hopline.tests"]`` of a run: what it showed, what it removed, the change's coverage."""
    if review.tests is None:
        return None
    record = review.tests.to_json()
    record["exitCode"] = review.run.exit_code
    record["timedOut"] = review.run.timed_out
    if review.removed is not None:
        record["removed"] = review.removed[:REMOVED_KEPT]
        record["removedCount"] = len(review.removed)
    if review.coverage is not None:
        record["coverage"] = review.coverage
    return record


def _where(file: str, line: int | None) -> str:
    return (file or "?") + (f":{line}" if line else "")


def tests_said(review: ReviewRun) -> str:
    """The lines a model reads after the run's output (empty for any other command)."""
    tests = review.tests
    if tests is None:
        return ""
    lines = []
    if review.run.timed_out:
        lines.append("[tests: killed at their timeout]")
    elif not tests.ran:
        lines.append(f"[tests: none ran: {tests.did_not_run}]")
    else:
        source = "JUnit XML" if tests.source == "junit" else "the runner's output"
        lines.append(f"[tests: {tests.summary or 'ran'} ({source})]")
    for failed in tests.failed[:FAILED_KEPT]:
        message = " ".join(failed.message.split())[:200]
        lines.append(f"[failed: {_where(failed.file, failed.line)} {failed.test}: {message}]")
    if len(tests.failed) > FAILED_KEPT:
        lines.append(f"[and {len(tests.failed) - FAILED_KEPT} more failed tests]")
    if review.removed:
        named = ", ".join(f"{r['test']} ({r['how']})" for r in review.removed[:REMOVED_KEPT])
        more = f" and {len(review.removed) - REMOVED_KEPT} more" if len(review.removed) > REMOVED_KEPT else ""
        lines.append(f"[tests the base runs that the head does not: {named}{more}]")
    elif review.removed is not None:
        lines.append("[every test the base runs, the head runs too]")
    if review.coverage is not None:
        lines.append(coverage_run.shown(review.coverage))
    return "\n" + "\n".join(lines)
