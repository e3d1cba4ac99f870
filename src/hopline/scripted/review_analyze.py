"""How the offline reviewer runs the analyzers (:mod:`hopline.harness.analyzers`) and reads their
reports, for appsec and qa_performance_security. Pure: no I/O.

Once the changed files and the lines the change adds are known (``git_diff added=true``), each of
the agent's analyzers is run through ``run_command`` over its files, at the head, in the sandbox. A
report that fits the tool-result cap is read from the result; a longer one is read from its kept
output (``@output/<id>``, where ``_meta["hopline.cut"]`` says) page by page with ``read_file``, each
page fed to the report's :class:`~hopline.harness.analyzers.RecordScanner`: the notes keep the
scanner's small state and the findings, never the report. The listing of added lines is paged the
same way when it is cut.

Every analyzer ends in a status the verdict states: ``ran``, ``missing`` (not installed), or
``failed`` (it exited with an error, ran past its timeout, or printed more than the capture
limit). A missing or failed ruff or detect-secrets makes the agent's verdict ``error``: never a
silent pass.
"""

from __future__ import annotations

import shlex
from typing import Any

from hopline.harness.analyzers import (
    BY_NAME,
    Analyzer,
    RecordScanner,
    analyzers_of,
    files_for,
    missing_module,
    to_finding,
)
from hopline.harness.rules import rule_of
from hopline.scripted.review import Result
from hopline.vocabulary import META_COMMAND, META_CUT

_CONTINUES = "\n[file continues: "
_MIN_PAGE = 512
ADDED_KIND = "added"


def wants_analyzers(agent: str) -> bool:
    return bool(analyzers_of(agent))


def start(notes: dict[str, Any]) -> None:
    """The notes' fields of the analyzers (kept as they are when already there)."""
    for key, empty in (("added", None), ("paging", []), ("planned", []), ("analyzers", {}), ("links", [])):
        notes.setdefault(key, empty)


def _ranges(spec: str) -> list[list[int]]:
    out = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            out.append([int(first), int(last or first)])
    return out


def _feed_added(notes: dict[str, Any], text: str, carry: str = "", final: bool = True) -> str:
    """Lines of an added-lines listing into the notes; the unfinished last line is returned."""
    lines = (carry + text).split("\n")
    rest = "" if final else lines.pop()
    for line in lines:
        path, tab, spec = line.rpartition("\t")
        if tab and path and not line.startswith("["):
            notes["added"].setdefault(path, []).extend(_ranges(spec))
    return rest


def _page_size(cut: dict[str, Any]) -> int:
    """A page that fits the cap with its continuation marker: the bytes the capped result kept, less
    room for that marker."""
    return max(_MIN_PAGE, int(cut.get("total", 0)) - int(cut.get("cut", 0)) - 256)


def fold_added(notes: dict[str, Any], result: Result) -> None:
    """The ``git_diff added=true`` result: the lines each file adds (or a page through its output)."""
    notes["added"] = {}
    if result.failed:
        notes["addedError"] = result.text[:300]
        return
    cut = result.meta.get(META_CUT)
    if isinstance(cut, dict) and str(cut.get("path") or "").startswith("@output/"):
        notes["paging"].append({"kind": ADDED_KIND, "path": cut["path"], "next": 0, "total": cut["total"],
                                "page": _page_size(cut), "carry": ""})
        return
    if "more bytes of the diff not captured" in result.text[-400:]:
        notes["addedError"] = ("the diff passed HOPLINE_COMMAND_OUTPUT_MAX_BYTES: its added lines are not "
                               "all known")
    _feed_added(notes, result.text)


def plan(agent: str, notes: dict[str, Any], links: list[str]) -> None:
    """The analyzer runs of ``agent`` over the changed files (once)."""
    if notes["analyzers"]:
        return
    changed = [(str(f[0]), int(f[1])) for f in notes["files"] or []]
    for analyzer in analyzers_of(agent):
        paths, skipped = files_for(analyzer, changed, links)
        commands = analyzer.commands(paths)
        notes["analyzers"][analyzer.name] = {"status": "ran" if not commands else "pending",
                                             "files": len(paths), "runs": len(commands), "findings": 0,
                                             "offLines": 0,
                                             "skipped": skipped, "detail": ""}
        notes["planned"] += [{"analyzer": analyzer.name, "command": c} for c in commands]


def _state(notes: dict[str, Any], name: str) -> dict[str, Any]:
    state: dict[str, Any] = notes["analyzers"][name]
    return state


def _files_of(analyzer: Analyzer, command: str) -> list[str]:
    return shlex.split(command)[3 + len(analyzer.args):]


def _records(notes: dict[str, Any], analyzer: Analyzer, command: str, records: list[dict[str, Any]]) -> None:
    files = _files_of(analyzer, command)
    state = _state(notes, analyzer.name)
    for record in records:
        raw = analyzer.read(record)
        if raw is None:
            continue
        finding = to_finding(raw, files, notes["added"] or {}, notes["agent"])
        if finding is None:
            state["offLines"] += rule_of(raw.rule).agent == notes["agent"]
        else:
            notes["analyzerFindings"] = [*notes.get("analyzerFindings", []), finding]
            state["findings"] += 1


def _ended(notes: dict[str, Any], name: str, status: str | None = None, detail: str = "") -> None:
    state = _state(notes, name)
    if status is not None and state["status"] != "failed":
        state["status"], state["detail"] = status, detail
    state["done"] = state.get("done", 0) + 1
    if state["status"] == "pending" and state["done"] >= state["runs"]:
        state["status"] = "ran"


def fold_run(notes: dict[str, Any], result: Result) -> None:
    """An analyzer's ``run_command`` result: its records, a page through its kept output, or the
    reason it did not run."""
    command = str(result.args.get("command") or "")
    entry = next((p for p in notes["planned"] if p["command"] == command), None)
    if entry is None:
        return
    notes["planned"] = [p for p in notes["planned"] if p is not entry]
    analyzer = BY_NAME[entry["analyzer"]]
    ran = result.meta.get(META_COMMAND)
    ran = ran if isinstance(ran, dict) else {}
    module = missing_module(result.text)
    if result.failed or ran.get("timedOut"):
        return _ended(notes, analyzer.name, "failed", f"it did not end: {result.text[-200:].strip()}")
    if ran.get("exitCode") not in (0, None):
        if module is not None and module.split(".")[0] == analyzer.module:
            return _ended(notes, analyzer.name, "missing", f"python -m {analyzer.module}: not installed")
        return _ended(notes, analyzer.name, "failed",
                      f"exit code {ran.get('exitCode')}: {' '.join(result.text[-300:].split())}")
    if ran.get("droppedBytes"):
        _ended(notes, analyzer.name, "failed", f"its report passed HOPLINE_COMMAND_OUTPUT_MAX_BYTES "
                                               f"({ran['droppedBytes']} bytes not captured)")
        return
    cut = result.meta.get(META_CUT)
    if isinstance(cut, dict) and str(cut.get("path") or "").startswith("@output/"):
        notes["paging"].append({"kind": analyzer.name, "command": command, "path": cut["path"], "next": 0,
                                "total": cut["total"], "page": _page_size(cut), "scan": None})
        return
    _records(notes, analyzer, command, RecordScanner(analyzer.depth).feed(result.text))
    _ended(notes, analyzer.name)


def fold_page(notes: dict[str, Any], result: Result) -> bool:
    """A page of a kept output being read (True), or another read (False)."""
    path, offset = result.args.get("path"), result.args.get("offset")
    entry = next((p for p in notes["paging"] if p["path"] == path and p["next"] == offset), None)
    if entry is None:
        return False
    read = result.meta.get("hopline.read")
    if result.failed or not isinstance(read, dict):
        notes["paging"] = [p for p in notes["paging"] if p is not entry]
        if entry["kind"] == ADDED_KIND:
            notes["addedError"] = f"its kept listing could not be read: {result.text[:200]}"
        else:
            _ended(notes, entry["kind"], "failed", f"its kept report could not be read: {result.text[:200]}")
        return True
    if result.meta.get(META_CUT):  # the page did not fit: read it again, smaller
        entry["page"] = max(64, entry["page"] // 2)
        return True
    text = result.text
    end = int(read["offset"]) + int(read["bytes"])
    if end < int(read["fileBytes"]) and (at := text.rfind(_CONTINUES)) >= 0:
        text = text[:at]
    entry["next"] = end
    done = end >= int(read["fileBytes"]) or int(read["bytes"]) == 0
    if entry["kind"] == ADDED_KIND:
        entry["carry"] = _feed_added(notes, text, entry["carry"], final=done)
    else:
        analyzer = BY_NAME[entry["kind"]]
        state = _state(notes, analyzer.name)
        state["pages"] = state.get("pages", 0) + 1
        scanner = RecordScanner(analyzer.depth, entry["scan"])
        _records(notes, analyzer, entry["command"], scanner.feed(text))
        entry["scan"] = scanner.state()
        if done:
            _ended(notes, analyzer.name)
    if done:
        notes["paging"] = [p for p in notes["paging"] if p is not entry]
    return True


def calls(notes: dict[str, Any], count: int) -> list[tuple[str, dict[str, Any]]]:
    """The next reads of kept outputs, else the next analyzer runs (at most ``count``)."""
    if notes["paging"]:
        return [("read_file", {"path": p["path"], "offset": p["next"], "limit": p["page"]})
                for p in notes["paging"][:count]]
    if notes["added"] is None or notes.get("addedError"):
        return []
    return [("run_command", {"command": p["command"]}) for p in notes["planned"][:count]]


def error_of(notes: dict[str, Any]) -> str | None:
    """Why the analyzers' review is not whole (a required one missing or failed), or None."""
    if notes.get("addedError"):
        return f"the lines the change adds could not be listed: {notes['addedError']}"
    if notes.get("planned") or notes.get("paging"):
        return "the analyzers could not all run (no run_command tool, or no iteration left)"
    for name, state in (notes.get("analyzers") or {}).items():
        if state["status"] in ("missing", "failed") and BY_NAME[name].required:
            fix = " (pip install hopline installs it)" if state["status"] == "missing" else ""
            return f"{name} {state['status']}: {state['detail']}{fix}"
    return None


def said(notes: dict[str, Any]) -> str:
    """What the analyzers did, for the verdict's summary."""
    parts = []
    for name, state in (notes.get("analyzers") or {}).items():
        if state["status"] == "missing":
            parts.append(f"{name} not installed" + ("" if BY_NAME[name].required else " (optional)"))
            continue
        if state["status"] == "failed":
            parts.append(f"{name} failed ({state['detail'][:160]})")
            continue
        skipped = state["skipped"]
        if not state["runs"]:
            parts.append(f"{name}: no file of its kind changed"
                         + (f" ({len(skipped)} skipped)" if skipped else ""))
            continue
        shown = ", ".join(f"{p} ({why})" for p, why in list(skipped.items())[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        parts.append(f"{name} ran on {state['files']} files: {state['findings']} findings on added lines"
                     + (f", {state['offLines']} elsewhere not counted" if state["offLines"] else "")
                     + (f" (its report read from the kept output in {state['pages']} pages)"
                        if state.get("pages") else "")
                     + (f"; skipped {shown}{more}" if skipped else ""))
    return "analyzers: " + "; ".join(parts) if parts else ""


def ran(notes: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict's ``analyzers``: each one's name, status and findings on added lines."""
    return [{"name": name, "status": state["status"], "files": state["files"], "findings": state["findings"]}
            for name, state in (notes.get("analyzers") or {}).items()]
