"""Configuration as a person meets it: docs/configuration.md is `hopline limits --markdown`, the README
shows the few variables a person sets, every variable the code reads is declared and spelled once,
and a variable hopline ignores although it looks like its own is warned about, not silently dropped."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tokenize
from collections import Counter
from pathlib import Path

import pytest

import hopline
from hopline import budget
from hopline.budget import FIXED, KNOWN_NAMES, common_table, environment_warnings, reference_markdown

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(hopline.__file__).parent
# What an environment variable's name looks like in hopline's code: its own, the provider's, the
# object store's, and the gateway's body limit (the name Express's users know).
_ENV_NAME = re.compile(r"(HOPLINE|OPENAI|AWS|API_JSON)_[A-Z0-9_]+")


def _hopline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HOPLINE_", "API_", "OPENAI_"))}
    return subprocess.run([sys.executable, "-m", "hopline", *args], capture_output=True, text=True,
                          env={**clean, **env}, timeout=60)


def test_docs_configuration_is_the_reference() -> None:
    """docs/configuration.md is what `hopline limits --markdown` prints (regenerate it with that)."""
    assert (ROOT / "docs" / "configuration.md").read_text() == reference_markdown()


def test_the_reference_names_every_variable_and_fixed_value() -> None:
    text = reference_markdown()
    assert all(f"`{name}`" in text for name in KNOWN_NAMES)
    assert all(f"`{c.name}`" in text for c in FIXED)


def test_the_readme_shows_what_a_person_sets_and_links_the_reference() -> None:
    readme = (ROOT / "README.md").read_text()
    table = common_table()
    assert "\n".join(table) in readme
    assert 8 <= len(table) - 2 <= 12  # the few a person sets; the rest is in the reference
    assert "(docs/configuration.md)" in readme


def test_every_variable_the_code_reads_is_declared_and_spelled_once() -> None:
    """A variable's name is one string literal in the whole package (its declaration); every other
    module imports it. Each is declared: a limit's, a setting's, or in hopline.budget.variables."""
    spelled: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text("utf-8")).readline):
            if token.type != tokenize.STRING:
                continue
            value = token.string.strip("\"'")
            if _ENV_NAME.fullmatch(value) and value not in budget.__all__:  # not a Python name
                spelled[value] += 1
                where.setdefault(value, []).append(str(path.relative_to(SOURCE)))
    assert {name: where[name] for name, count in spelled.items() if count > 1} == {}
    assert sorted(set(spelled) - KNOWN_NAMES) == []
    assert sorted(KNOWN_NAMES - set(spelled)) == []


def test_a_fixed_values_name_and_a_typo_are_warned_about() -> None:
    warnings = environment_warnings({"COMPACTION_THRESHOLD": "0.5", "HOPLINE_TRANSPORT_MAX_BODY_BYTE": "1",
                                     "HOPLINE_TRANSPORT_MAX_BODY_BYTES": "8mb", "PATH": "/bin"})
    assert len(warnings) == 2
    fixed, typo = warnings
    assert fixed.startswith("COMPACTION_THRESHOLD is ignored") and "fixed value" in fixed and "0.7" in fixed
    assert typo.startswith("HOPLINE_TRANSPORT_MAX_BODY_BYTE is ignored")
    assert "did you mean HOPLINE_TRANSPORT_MAX_BODY_BYTES?" in typo
    assert environment_warnings({name: "1" for name in KNOWN_NAMES}) == []  # no real name is warned about


@pytest.mark.e2e
def test_limits_warns_of_a_fixed_value_and_a_typo() -> None:
    fixed = _hopline("limits", "--json", env={"COMPACTION_THRESHOLD": "0.5"})
    assert fixed.returncode == 0, fixed.stderr
    assert "warning: COMPACTION_THRESHOLD is ignored" in fixed.stderr and "fixed value" in fixed.stderr
    assert '"COMPACTION_THRESHOLD","hop":"harness.context","value":0.7' in fixed.stdout
    typo = _hopline("limits", env={"HOPLINE_TRANSPORT_MAX_BODY_BYTE": "1"})
    assert typo.returncode == 0, typo.stderr
    assert "did you mean HOPLINE_TRANSPORT_MAX_BODY_BYTES?" in typo.stderr
    assert _hopline("limits", "--json", env={}).stderr == ""


@pytest.mark.e2e
def test_limits_markdown_is_the_reference_whatever_the_environment_holds() -> None:
    env = {"HOPLINE_PIPE_MAX_FRAME_BYTES": "64 megs", "API_JSON_BODY_LIMIT": "1kb",
           "COMPACTION_THRESHOLD": "1"}
    result = _hopline("limits", "--markdown", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (ROOT / "docs" / "configuration.md").read_text()
