"""detect-secrets' report on a gate run's files, kept per file for the run's later rounds.

detect-secrets reads every text file a change adds, whole (a pull request's logs: hundreds of KiB),
and what it reports on one file depends only on the scan's options, the file's path and its bytes. A
gate run's sessions (one per agent and round) share a directory (``ReviewRange.cache``, in the run's
work directory, removed with it): there, a scan runs only over the files whose path and bytes it has
not scanned yet, and its report is that scan's own with the kept files' results put back in, what
one scan over all of them prints. Only the form the gate's analyzers run (``python -m detect_secrets
scan`` and regular files of the checkout, no option) is kept; a scan that did not end with a report
keeps nothing and is said as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

MODULE = "detect_secrets"
_HEADER = ("version", "plugins_used", "filters_used")


@dataclasses.dataclass
class SecretsScan:
    """One scan over ``files``: ``missing`` are to be scanned (their keys in ``keys``), the others'
    results are in ``kept``."""

    directory: Path
    prefix: list[str]  # the argv before the files
    kept: dict[str, list[Any]]
    missing: list[str]
    keys: dict[str, str]

    @property
    def argv(self) -> list[str]:
        """What runs: the scan over the files not kept (nothing when every file is)."""
        return [*self.prefix, *self.missing] if self.missing else []

    def report(self, fresh: str | None) -> str | None:
        """The whole report: ``fresh`` (the scan's output over :attr:`missing`, or None when nothing
        ran) with the kept files' results; None when ``fresh`` is not a report (nothing is kept)."""
        if fresh is None:
            header = _read(self.directory / "header.json")
            if not isinstance(header, dict):
                return None
            report: dict[str, Any] = {**header, "results": {}}
        else:
            try:
                report = json.loads(fresh)
            except ValueError:
                return None
            if not isinstance(report, dict) or not isinstance(report.get("results"), dict):
                return None
            _write(self.directory / "header.json", {k: report.get(k) for k in _HEADER})
            for path in self.missing:
                _write(self.directory / f"{self.keys[path]}.json", report["results"].get(path) or [])
        results = {**report["results"], **{path: found for path, found in self.kept.items() if found}}
        report["results"] = {path: results[path] for path in sorted(results)}
        return json.dumps(report, indent=2)


def scan_of(directory: Path | None, argv: list[str], python: str, root: Path) -> SecretsScan | None:
    """The kept and the missing files of ``argv`` (as run) when it is the gate's detect-secrets scan
    over regular files of ``root`` and a cache directory is given; else None (it runs as it is)."""
    if directory is None or argv[:4] != [python, "-m", MODULE, "scan"] or len(argv) == 4:
        return None
    files = argv[4:]
    digests: dict[str, str] = {}
    for path in files:
        digest = _digest(root, path)
        if digest is None:
            return None
        digests[path] = digest
    kept: dict[str, list[Any]] = {}
    keys: dict[str, str] = {}
    for path in dict.fromkeys(files):
        key = hashlib.sha256(json.dumps([python, path, digests[path]]).encode()).hexdigest()
        found = _read(directory / f"{key}.json")
        if isinstance(found, list):
            kept[path] = found
        else:
            keys[path] = key
    return SecretsScan(directory, argv[:4], kept, list(keys), keys)


def _digest(root: Path, path: str) -> str | None:
    """The sha256 of a regular file named relative to ``root`` with no symlink on its way, or None."""
    parts = Path(path).parts
    if not parts or path.startswith("-") or os.path.isabs(path) or ".." in parts:
        return None
    where, mode = root, 0
    for part in parts:
        where = where / part
        try:
            mode = os.lstat(where).st_mode
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            return None
    if not stat.S_ISREG(mode):
        return None
    digest = hashlib.sha256()
    try:
        with open(where, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def _write(path: Path, value: Any) -> None:
    """Written whole or not at all (a concurrent reader sees the old file or the new one)."""
    part = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        part.write_text(json.dumps(value))
        os.replace(part, path)
