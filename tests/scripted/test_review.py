"""The scripted model's review rules, on real `git diff` text (pure functions)."""

from __future__ import annotations

from hopline.harness.diffs import AddedLine, parse_diff, parse_numstat
from hopline.scripted.review import GATE_AGENTS, LINE_RULES, line_findings, untested_findings

DIFF = """diff --git a/src/app.py b/src/app.py
index 1111111..2222222 100644
--- a/src/app.py
+++ b/src/app.py
@@ -1,3 +1,6 @@
 import os
-x = 1
+x = os.environ["X"]
+password = os.environ["PASSWORD"]
+value = eval(text)  # TODO: parse safely
 y = 0
 def f():
@@ -10,2 +13,3 @@ def g():
     return 1
+    obj.eval(x) and literal_eval(x)
diff --git a/web/app.js b/web/app.js
new file mode 100644
--- /dev/null
+++ b/web/app.js
@@ -0,0 +1,3 @@
+// never eval(input): it comes from users
+const text = "eval(x) is unsafe";
+let value = eval(input);
diff --git a/logs/run.log b/logs/run.log
new file mode 100644
--- /dev/null
+++ b/logs/run.log
@@ -0,0 +1,2 @@
+PASSED tests/test_a.py::test_a
+ERROR FAILED tests/test_a.py::test_b
"""


def test_added_lines_carry_their_new_line_numbers() -> None:
    added = parse_diff(DIFF)
    assert [(a.path, a.line) for a in added] == [
        ("src/app.py", 2), ("src/app.py", 3), ("src/app.py", 4), ("src/app.py", 14),
        ("web/app.js", 1), ("web/app.js", 2), ("web/app.js", 3), ("logs/run.log", 1), ("logs/run.log", 2)]
    # a piece read after a cut: no hunk header, so no line number, but the file named by the caller
    cut = parse_diff("+AWS = 'AKIAABCDEFGHIJKLMNOP'\n[hopline: 10 bytes cut]\n+more", path="src/k.py")
    assert [(a.path, a.line) for a in cut] == [("src/k.py", None), ("src/k.py", None)]


def test_each_gate_agent_finds_its_own_domain_in_the_added_lines() -> None:
    added = parse_diff(DIFF)
    found = {agent: [(f["rule"], f["file"], f["line"]) for f in line_findings(agent, added)]
             for agent in GATE_AGENTS}
    assert found == {
        "qa_automation": [("test-failure", "logs/run.log", 2)],
        # ruff's S307 reads Python; in JavaScript, not in a comment nor a string, not obj.eval(
        "qa_performance_security": [("unsafe-eval", "web/app.js", 3)],
        "qa_strategy": [("todo-added", "src/app.py", 4)],
        "appsec": [],  # credentials are detect-secrets' (tests/harness/test_analyzers.py)
    }
    compared = [AddedLine("src/sig.py", 7, "    return hmac.new(k, body, 'sha256').hexdigest() == given"),
                AddedLine("src/sig.py", 8, "    if signature == '': return False  # digest == x, a comment"),
                AddedLine("src/sig.py", 9, "    ok = hmac.compare_digest(expected_signature, given)"),
                AddedLine("src/sig.js", 1, "if (signature == given) {}")]
    assert [(f["rule"], f["file"], f["line"]) for f in line_findings("appsec", compared)] == [
        ("timing-unsafe-compare", "src/sig.py", 7)]
    assert {r.agent for r in LINE_RULES} == set(GATE_AGENTS)


def test_a_changed_source_file_with_no_changed_test_is_untested() -> None:
    files = parse_numstat("3\t1\tsrc/app.py\n0\t4\tsrc/old.py\n-\t-\timg.png\n2\t0\t{src => lib}/b.py\n")
    assert files == [["src/app.py", 3, 1], ["src/old.py", 0, 4], ["img.png", 0, 0], ["lib/b.py", 2, 0]]
    untested = untested_findings(files, {"src/app.py": 2})
    assert [(f["file"], f["line"]) for f in untested] == [("src/app.py", 2), ("lib/b.py", None)]
    assert untested_findings([*files, ["tests/test_app.py", 5, 0]], {}) == []
