"""docs/design.md defines every requirement id the code cites (``B-1``, ``T-9``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
CITED = re.compile(r"\b[A-Z]-\d+\b")
# A definition is a bullet that opens with the id in bold: "- **B-1 One table.** ..." or "- **B-1** ...".
DEFINED = re.compile(r"^- \*\*([A-Z]-\d+)\b", re.MULTILINE)
CODE_DIRS = ("src", "tests", "bench", "tools")


def defined_ids() -> set[str]:
    return set(DEFINED.findall(DESIGN.read_text(encoding="utf-8")))


def cited_ids() -> dict[str, str]:
    """Each id cited in the code, with one place that cites it."""
    cited: dict[str, str] = {}
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for ident in CITED.findall(line):
                    cited.setdefault(ident, f"{path.relative_to(ROOT)}:{number}")
    return cited


def test_every_cited_id_is_defined() -> None:
    missing = {ident: where for ident, where in cited_ids().items() if ident not in defined_ids()}
    assert not missing, f"ids cited in the code but not defined in docs/design.md: {missing}"


def test_each_id_is_defined_once() -> None:
    found = DEFINED.findall(DESIGN.read_text(encoding="utf-8"))
    assert len(found) == len(set(found)), sorted(i for i in found if found.count(i) > 1)


def test_the_checker_sees_definitions_and_citations() -> None:
    # Guards the two patterns themselves: a rename of the page's bullets would otherwise pass vacuously.
    assert {"B-1", "T-9", "K-6", "A-1"} <= defined_ids()
    assert "D-8" in cited_ids()
