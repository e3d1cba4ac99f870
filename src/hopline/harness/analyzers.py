"""The analyzers a gate agent runs over the head's files, and what their JSON reports say. Pure.

Each row of :data:`ANALYZERS` is one tool: the command (always ``python -m <module>``, so the
interpreter the agent runs finds it, installed beside hopline), the files it takes (the changed
Python files, or every added text file but lock, vendored and minified ones), whether a gate may run
without it (ruff and detect-secrets are hopline's dependencies: a missing one is an ``error``;
bandit and semgrep run when installed), and how one record of its report becomes a finding with the
analyzer's rule id and documentation link.

A report is read as it comes, page by page (:class:`RecordScanner`): a report longer than the
tool-result cap is read from its kept output in pieces, and only the records at the report's
findings depth are kept, one at a time, so no piece of JSON larger than one record is ever held.
Findings outside the lines the change adds are dropped (counted).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from typing import Any

from hopline.harness.diffs import is_test_path
from hopline.harness.rules import rule_of, severity_of

# The target version ruff parses with: the newest it knows, so no new syntax reads as an error.
RUFF_TARGET = "py313"
_LOCK_FILES = frozenset({"package-lock.json", "yarn.lock", "pnpm-lock.yaml", "poetry.lock", "Pipfile.lock",
                         "Cargo.lock", "go.sum", "composer.lock", "Gemfile.lock", "uv.lock", "pdm.lock",
                         "npm-shrinkwrap.json", "bun.lockb", "flake.lock", "mix.lock", "packages.lock.json"})
_VENDORED = frozenset({"vendor", "vendored", "_vendor", "third_party", "third-party", "node_modules",
                       "bower_components"})
_MINIFIED = re.compile(r"\.min\.(?:js|css|mjs)$|\.(?:js|css)\.map$")
# What shlex would quote and the command policy refuses (shell syntax), or an option's look.
_UNSAFE_NAME = re.compile(r"[;&|<>`$(){}\\\n\r]|^-")
_MISSING = re.compile(r"No module named '?([\w.]+)'?")
_DETECT_SECRETS_PLUGINS = {
    "AWS Access Key": ("AWSKeyDetector", "aws"),
    "Artifactory Credentials": ("ArtifactoryDetector", "artifactory"),
    "Azure Storage Account access key": ("AzureStorageKeyDetector", "azure_storage_key"),
    "Base64 High Entropy String": ("Base64HighEntropyString", "high_entropy_strings"),
    "Basic Auth Credentials": ("BasicAuthDetector", "basic_auth"),
    "Cloudant Credentials": ("CloudantDetector", "cloudant"), "Discord Bot Token": ("DiscordBotTokenDetector",
                                                                                  "discord"),
    "GitHub Token": ("GitHubTokenDetector", "github_token"), "GitLab Token": ("GitLabTokenDetector",
                                                                               "gitlab_token"),
    "Hex High Entropy String": ("HexHighEntropyString", "high_entropy_strings"),
    "IBM COS HMAC Credentials": ("IbmCosHmacDetector", "ibm_cos_hmac"),
    "IBM Cloud IAM Key": ("IbmCloudIamDetector", "ibm_cloud_iam"),
    "JSON Web Token": ("JwtTokenDetector", "jwt"),
    "Mailchimp Access Key": ("MailchimpDetector", "mailchimp"), "NPM tokens": ("NpmDetector", "npm"),
    "OpenAI Token": ("OpenAIDetector", "openai"), "Private Key": ("PrivateKeyDetector", "private_key"),
    "Public IP (ipv4)": ("IPPublicDetector", "ip_public"), "PyPI Token": ("PypiTokenDetector", "pypi_token"),
    "Secret Keyword": ("KeywordDetector", "keyword"), "SendGrid API Key": ("SendGridDetector", "sendgrid"),
    "Slack Token": ("SlackDetector", "slack"), "SoftLayer Credentials": ("SoftlayerDetector", "softlayer"),
    "Square OAuth Secret": ("SquareOAuthDetector", "square_oauth"),
    "Stripe Access Key": ("StripeDetector", "stripe"), "Telegram Bot Token": ("TelegramBotTokenDetector",
                                                                             "telegram_token"),
    "Twilio API Key": ("TwilioKeyDetector", "twilio"),
}
_DETECT_SECRETS_SOURCE = "https://github.com/Yelp/detect-secrets/blob/master/detect_secrets/plugins/{}.py"


@dataclasses.dataclass(frozen=True)
class Raw:
    """One record of a report, as the analyzer said it (its path as it printed it)."""

    rule: str
    path: str
    line: int | None
    message: str
    column: int | None = None
    end_line: int | None = None
    help_uri: str | None = None
    said: str | None = None  # the analyzer's own level, when it gives one (bandit, semgrep)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _ruff(record: dict[str, Any]) -> Raw | None:
    start, end = record.get("location") or {}, record.get("end_location") or {}
    code = record.get("code") or record.get("name")
    if not isinstance(code, str) or not isinstance(record.get("filename"), str):
        return None
    return Raw(f"ruff/{code}", record["filename"], _int(start.get("row")), str(record.get("message") or code),
               _int(start.get("column")), _int(end.get("row")), record.get("url") or None)


def _detect_secrets(record: dict[str, Any]) -> Raw | None:
    kind = record.get("type")
    if not isinstance(kind, str) or not isinstance(record.get("filename"), str):
        return None
    plugin, module = _DETECT_SECRETS_PLUGINS.get(kind, (re.sub(r"\W", "", kind), None))
    return Raw(f"detect-secrets/{plugin}", record["filename"], _int(record.get("line_number")),
               f"{kind} in the change: it is public to every reader of the repository; revoke it, and read "
               "it from the environment or a secret store",
               help_uri=_DETECT_SECRETS_SOURCE.format(module) if module else None)


def _bandit(record: dict[str, Any]) -> Raw | None:
    if not isinstance(record.get("test_id"), str) or not isinstance(record.get("filename"), str):
        return None
    column = record.get("col_offset")
    return Raw(f"bandit/{record['test_id']}", record["filename"], _int(record.get("line_number")),
               str(record.get("issue_text") or record["test_id"]),
               column + 1 if isinstance(column, int) else None, None, record.get("more_info") or None,
               str(record.get("issue_severity") or "") or None)


def _semgrep(record: dict[str, Any]) -> Raw | None:
    if not isinstance(record.get("check_id"), str) or not isinstance(record.get("path"), str):
        return None
    start, end, extra = record.get("start") or {}, record.get("end") or {}, record.get("extra") or {}
    meta = extra.get("metadata") or {}
    refs = meta.get("references") if isinstance(meta.get("references"), list) else []
    link = meta.get("source") or (refs[0] if refs else None)
    return Raw(f"semgrep/{record['check_id']}", record["path"], _int(start.get("line")),
               str(extra.get("message") or record["check_id"]), _int(start.get("col")), _int(end.get("line")),
               link if isinstance(link, str) else None, str(extra.get("severity") or "") or None)


@dataclasses.dataclass(frozen=True)
class Analyzer:
    """One analyzer: how it runs, over which files, and how its report's records read."""

    name: str
    module: str
    args: tuple[str, ...]  # after ``python -m <module>``, before the files
    files: str  # "python" or "text"
    required: bool
    depth: int  # the nesting depth of its report's finding records
    read: Callable[[dict[str, Any]], Raw | None]
    agents: frozenset[str]
    docs: str
    batch: int = 100  # files per run

    @property
    def scope(self) -> str:
        """The files it scans, in words."""
        return ("the changed Python files" if self.files == "python"
                else "every added text file but lock, vendored and minified files")

    def commands(self, paths: list[str]) -> list[str]:
        """The command lines that scan ``paths`` (in batches)."""
        return [shlex.join(["python", "-m", self.module, *self.args, *paths[i:i + self.batch]])
                for i in range(0, len(paths), self.batch)]


_APPSEC = frozenset({"appsec"})
ANALYZERS: tuple[Analyzer, ...] = (
    Analyzer("ruff", "ruff", ("check", "--isolated", "--no-cache", "--exit-zero", "--select", "S,E9,F",
                              "--ignore", "S101", "--target-version", RUFF_TARGET, "--output-format", "json"),
             "python", True, 1, _ruff, frozenset({"appsec", "qa_performance_security"}),
             "https://docs.astral.sh/ruff/"),
    Analyzer("detect-secrets", "detect_secrets", ("scan",), "text", True, 3, _detect_secrets, _APPSEC,
             "https://github.com/Yelp/detect-secrets"),
    Analyzer("bandit", "bandit", ("-f", "json", "-q", "--exit-zero", "--skip", "B101"), "python", False, 2,
             _bandit, _APPSEC, "https://bandit.readthedocs.io/"),
    Analyzer("semgrep", "semgrep", ("scan", "--json", "--quiet", "--metrics", "off",
                                    "--disable-version-check", "--config", ".semgrep.yml"),
             "text", False, 2, _semgrep, _APPSEC, "https://semgrep.dev/docs/"),
)
BY_NAME = {a.name: a for a in ANALYZERS}


def analyzers_of(agent: str) -> list[Analyzer]:
    return [a for a in ANALYZERS if agent in a.agents]


def skip_reason(path: str) -> str | None:
    """Why detect-secrets leaves ``path`` out (a lock file, vendored or minified code), or None."""
    parts = PurePosixPath(path).parts
    if parts and parts[-1] in _LOCK_FILES:
        return "a lock file"
    if any(p in _VENDORED for p in parts[:-1]):
        return "vendored"
    if _MINIFIED.search(path):
        return "minified"
    return None


def files_for(analyzer: Analyzer, changed: Iterable[tuple[str, int]], links: Iterable[str]
              ) -> tuple[list[str], dict[str, str]]:
    """The changed files ``analyzer`` scans (of ``(path, added lines)``), and those it skips, with
    why. Symlinks are never scanned (their target may lie outside the checkout)."""
    linked = set(links)
    scan: list[str] = []
    skipped: dict[str, str] = {}
    for path, added in changed:
        if added <= 0 or path in linked:
            continue
        if analyzer.files == "python" and PurePosixPath(path).suffix not in (".py", ".pyi"):
            continue
        reason = skip_reason(path) if analyzer.files == "text" else None
        if reason is None and _UNSAFE_NAME.search(path):
            reason = "a name the command policy refuses"
        if reason is not None:
            skipped[path] = reason
        else:
            scan.append(path)
    return scan, skipped


def missing_module(text: str) -> str | None:
    """The module an ``python -m`` run said it could not find, if it did."""
    found = _MISSING.search(text[-2000:])
    return found.group(1) if found else None


class RecordScanner:
    """The JSON objects at one nesting depth of a document read piece by piece; its state is a small
    JSON object (kept in an agent's notes between pieces)."""

    _TOKENS = re.compile(r'["\\{}\[\]]')

    def __init__(self, depth: int, state: dict[str, Any] | None = None) -> None:
        self.depth = depth
        state = state or {}
        self.level = int(state.get("level", 0))
        self.in_string = bool(state.get("inString", False))
        self.escaped = bool(state.get("escaped", False))
        self.record: str | None = state.get("record")

    def state(self) -> dict[str, Any]:
        return {"level": self.level, "inString": self.in_string, "escaped": self.escaped,
                "record": self.record}

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The records that end in ``text`` (those that started in an earlier piece included)."""
        out: list[dict[str, Any]] = []
        start = 0 if self.record is not None else None
        position = 1 if self.escaped else 0  # the piece before ended on a backslash inside a string
        self.escaped = False
        while (match := self._TOKENS.search(text, position)) is not None:
            char, at = match.group(), match.start()
            position = at + 1
            if self.in_string:
                if char == "\\":
                    self.escaped = at + 1 >= len(text)
                    position = at + 2
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                if char == "{" and self.level == self.depth and start is None:
                    start, self.record = at, ""
                self.level += 1
            elif char in "}]":
                self.level -= 1
                if char == "}" and self.level == self.depth and start is not None:
                    piece = (self.record or "") + text[start:at + 1]
                    self.record, start = None, None
                    try:
                        value = json.loads(piece)
                    except ValueError:
                        continue
                    if isinstance(value, dict):
                        out.append(value)
        if start is not None:
            self.record = (self.record or "") + text[start:]
        return out


def _scanned_path(printed: str, scanned: Iterable[str]) -> str | None:
    """Which scanned file an analyzer's printed path is (absolute, ``./``-prefixed or as given)."""
    printed = printed.replace("\\", "/")
    best = None
    for path in scanned:
        if (printed == path or printed.endswith("/" + path)) and (best is None or len(path) > len(best)):
            best = path
    return best


def added_line(line: int | None, ranges: list[list[int]] | None) -> bool:
    """Whether ``line`` is one the change adds (``ranges``: ``[first, last]`` pairs)."""
    return line is not None and any(first <= line <= last for first, last in ranges or [])


def to_finding(raw: Raw, scanned: Iterable[str], added: dict[str, list[list[int]]],
               agent: str) -> dict[str, Any] | None:
    """The finding of one analyzer record for ``agent`` when it is on a line the change adds and in
    the agent's domain (the severity table's agent column), else None: the analyzer's rule id, the
    table's severity (lower in a test file), the documentation link."""
    path = _scanned_path(raw.path, scanned)
    if path is None or not added_line(raw.line, added.get(path)):
        return None
    if rule_of(raw.rule).agent != agent:
        return None
    finding: dict[str, Any] = {"severity": severity_of(raw.rule, tests=is_test_path(path), said=raw.said),
                               "file": path, "line": raw.line, "rule": raw.rule,
                               "message": " ".join(raw.message.split())}
    if raw.column is not None:
        finding["column"] = raw.column
    if raw.end_line is not None and raw.end_line >= (raw.line or 0):
        finding["endLine"] = raw.end_line
    if raw.help_uri is not None and raw.help_uri.startswith("https://"):
        finding["helpUri"] = raw.help_uri
    return finding
