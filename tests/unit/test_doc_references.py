"""The documents cite tests as proof (docs/faults.md's fault table above all): every cited test
file and test function must exist, so a renamed or merged test cannot leave a row unproven."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    path
    for path in ROOT.rglob("*.md")
    if not {".venv", "node_modules", ".git"} & set(path.relative_to(ROOT).parts)
)
# `tests/unit/x.py::test_name` names a file and a test; a later `::test_other` in the same
# line names another test of the file named last.
CITATION = re.compile(r"`(tests/[\w/]+\.py)?(?:::(\w+))?[`\[]")


def citations(text: str) -> list[tuple[int, str, str | None]]:
    """(line number, test file, test function or None) for every test the text cites."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        current: str | None = None
        for match in CITATION.finditer(line):
            path, function = match.groups()
            if path is None and function is None:
                continue
            current = path or current
            if current is None:
                continue  # `::name` with no file named before it on the line: not a citation
            found.append((number, current, function))
    return found


def test_the_citation_reader_follows_files_within_a_line() -> None:
    line = "| fault | `tests/unit/a.py::test_one` and `::test_two`; `tests/b.py` |"
    assert citations(line) == [
        (1, "tests/unit/a.py", "test_one"),
        (1, "tests/unit/a.py", "test_two"),
        (1, "tests/b.py", None),
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(document: Path) -> None:
    missing = []
    for number, path, function in citations(document.read_text()):
        source = ROOT / path
        if not source.is_file():
            missing.append(f"line {number}: {path} does not exist")
        elif function and not re.search(rf"^(async )?def {function}\(", source.read_text(), re.M):
            missing.append(f"line {number}: {path} has no test {function}")
    assert not missing, f"{document.relative_to(ROOT)} cites tests that are gone:\n" + "\n".join(
        missing
    )
