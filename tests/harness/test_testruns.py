"""What a run of the test command showed (harness/testruns) and which added lines no test runs
(harness/tools/coverage_run): pure functions, on what pytest 8, unittest and coverage 7 really print."""

from __future__ import annotations

import json

from hopline.harness.testruns import analyze, error_cause, removed_tests, runner_of
from hopline.harness.tools.coverage_run import added_lines, change_coverage, changed_python

PYTEST = ["/venv/bin/python", "-m", "pytest", "-rA"]
UNITTEST = ["/venv/bin/python", "-m", "unittest", "discover", "-v"]
JUNIT = (b'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
         b'failures="1" skipped="1" tests="4">'
         b'<testcase classname="tests.test_calc" name="test_add" file="tests/test_calc.py" line="3">'
         b'<failure message="assert -1 == 3&#10; +  where -1 = add(1, 2)">tests/test_calc.py:5: in test_add\n'
         b'    assert add(1, 2) == 3\nE   assert -1 == 3</failure></testcase>'
         b'<testcase classname="tests.test_calc" name="test_ok" file="tests/test_calc.py" line="6" />'
         b'<testcase classname="tests.test_calc" name="test_skip" file="tests/test_calc.py" line="9">'
         b'<skipped message="x" /></testcase>'
         b'<testcase classname="tests.test_calc.TestK" name="test_m" file="tests/test_calc.py" line="14" />'
         b'</testsuite></testsuites>')
COLLECTION = (b'<?xml version="1.0" encoding="utf-8"?><testsuites>'
              b'<testsuite name="pytest" errors="1" tests="1">'
              b'<testcase classname="" name="tests.test_bad" file="tests/test_bad.py">'
              b'<error message="collection failure">ImportError while importing test module '
              b"'/ck/tests/test_bad.py'.\ntests/test_bad.py:1: in &lt;module&gt;\n    import nothere\n"
              b"E   ModuleNotFoundError: No module named 'nothere'</error></testcase>"
              b"</testsuite></testsuites>")
UNITTEST_OUT = """tests.test_imp (unittest.loader._FailedTest.tests.test_imp) ... ERROR
test_add (tests.test_u.CalcTest.test_add) ... FAIL
test_ok (tests.test_u.CalcTest.test_ok) ... ok
test_skip (tests.test_u.CalcTest.test_skip) ... skipped 'later'

======================================================================
ERROR: tests.test_imp (unittest.loader._FailedTest.tests.test_imp)
----------------------------------------------------------------------
ImportError: Failed to import test module: tests.test_imp
Traceback (most recent call last):
  File "/ck/tests/test_imp.py", line 1, in <module>
    import nothere
ModuleNotFoundError: No module named 'nothere'


======================================================================
FAIL: test_add (tests.test_u.CalcTest.test_add)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/ck/tests/test_u.py", line 6, in test_add
    self.assertEqual(1 + 1, 3)
AssertionError: 2 != 3

----------------------------------------------------------------------
Ran 4 tests in 0.001s

FAILED (failures=1, errors=1, skipped=1)
"""


def test_pytest_s_junit_report_names_each_failure_at_its_line_with_its_assertion() -> None:
    run = analyze(PYTEST, "1 failed, 2 passed, 1 skipped in 0.2s\n", 1, JUNIT, ["/ck"])
    assert (run.runner, run.source, run.ran) == ("pytest", "junit", True)
    [failed] = run.failed
    assert (failed.test, failed.file, failed.line) == ("tests/test_calc.py::test_add", "tests/test_calc.py",
                                                       5)
    assert failed.message == "assert -1 == 3\n +  where -1 = add(1, 2)"
    assert run.statuses == {"tests/test_calc.py::test_add": "failed", "tests/test_calc.py::test_ok": "passed",
                            "tests/test_calc.py::test_skip": "skipped",
                            "tests/test_calc.py::TestK::test_m": "passed"}
    assert run.summary == "1 failed, 2 passed, 1 skipped"


def test_a_run_that_ran_no_test_says_why() -> None:
    collection = analyze(PYTEST, "", 2, COLLECTION, ["/ck"])
    assert collection.did_not_run == ("1 test module did not import (tests/test_bad.py: No module named "
                                      "nothere)")
    no_pytest = analyze(PYTEST, "/venv/bin/python: No module named pytest\n", 1, None, ["/ck"])
    assert no_pytest.did_not_run == "No module named pytest" and not no_pytest.ran
    empty = analyze(PYTEST, "no tests ran in 0.01s\n", 5,
                    b'<?xml version="1.0"?><testsuites><testsuite tests="0"/></testsuites>', [])
    assert empty.did_not_run == "no tests ran: pytest collected none (exit code 5)"
    zero = analyze(UNITTEST, "\n" + "-" * 70 + "\nRan 0 tests in 0.000s\n\nOK\n", 0, None, [])
    assert zero.did_not_run == "no tests ran (Ran 0 tests)"
    make = analyze(["make", "test"], "pytest -q\nno tests ran in 0.01s\nmake: *** [test] Error 5\n", 2,
                   None)
    assert make.runner == "other" and make.did_not_run == "no tests ran"
    passing = analyze(["make", "test"], "all good\n", 0, None)
    assert passing.ran and passing.did_not_run is None


def test_unittest_verbose_output_is_read_test_by_test() -> None:
    run = analyze(UNITTEST, UNITTEST_OUT, 1, None, ["/ck"])
    assert run.runner == "unittest"
    assert run.did_not_run == "1 test module did not import (tests.test_imp: No module named nothere)"
    [failed] = run.failed
    assert (failed.test, failed.file, failed.line, failed.message) == (
        "tests.test_u.CalcTest.test_add", "tests/test_u.py", 6, "AssertionError: 2 != 3")
    assert run.statuses["tests.test_u.CalcTest.test_skip"] == "skipped"
    assert run.counts == {"ran": 4, "failed": 1, "skipped": 1}


def test_tests_the_head_drops_or_skips_are_removed() -> None:
    base = analyze(PYTEST, "", 0, JUNIT.replace(b"<failure", b"<x").replace(b"</failure>", b"</x>"), [])
    head_junit = JUNIT.replace(b'name="test_ok"', b'name="test_renamed"').replace(
        b'line="14" />', b'line="14"><skipped message="later" /></testcase>')
    head = analyze(PYTEST, "", 0, head_junit, [])
    assert removed_tests(base, head) == [
        {"test": "tests/test_calc.py::TestK::test_m", "file": "tests/test_calc.py", "how": "skipped"},
        {"test": "tests/test_calc.py::test_ok", "file": "tests/test_calc.py", "how": "gone"}]
    assert removed_tests(base, base) == []


def test_a_cause_names_no_path_of_the_machine() -> None:
    output = "E   FileNotFoundError: No such file: '/tmp/pytest-of-root/x/written' in /ck/tests/a.py\n"
    said = error_cause(output, ["/ck"])
    assert said == "FileNotFoundError: No such file: 'written' in tests/a.py"
    assert runner_of(["pytest", "-q"]) == "pytest" and runner_of(["python3", "-m", "unittest"]) == "unittest"


def test_untested_added_lines_come_in_runs_between_lines_that_ran() -> None:
    diff = ("diff --git a/src/calc.py b/src/calc.py\n--- a/src/calc.py\n+++ b/src/calc.py\n"
            "@@ -1,0 +2,3 @@\n+    if a < 0:\n+        raise ValueError(a)\n+        # why\n"
            "@@ -5,0 +9,2 @@\n+    x = 1\n+    y = 2\n")
    added = added_lines(diff)
    assert added == {"src/calc.py": [2, 3, 4, 9, 10]}
    lines = {"executed_lines": [1, 2, 5], "missing_lines": [3, 9, 10]}
    report = json.dumps({"files": {"src/calc.py": lines}})
    coverage = change_coverage(report.encode(), added, ["src/calc.py", "src/other.py"])
    assert coverage == {"src/calc.py": {"measured": True, "statements": 4, "tested": 1,
                                        "untested": [[3, 3], [9, 10]]},
                        "src/other.py": {"measured": False}}
    numstat = "3\t1\tsrc/calc.py\n2\t0\ttests/test_calc.py\n1\t0\tREADME.md\n0\t4\tsrc/gone.py\n"
    assert changed_python(numstat) == ["src/calc.py"]
