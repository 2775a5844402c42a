"""What the documents show must still be true of the code: every test a document cites as proof
(docs/faults.md's fault table above all) exists, and every `mur` command a document shows
parses with today's flags and choices, so a renamed test or flag cannot leave a row unproven
or a reproduction command broken."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mur.cli

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    path
    for path in ROOT.rglob("*.md")
    if not {".venv", "node_modules", ".git"} & set(path.relative_to(ROOT).parts)
)


def document_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ------------------------------------------------------------------------------ cited tests

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


@pytest.mark.parametrize("document", DOCUMENTS, ids=document_id)
def test_every_cited_test_exists(document: Path) -> None:
    missing = []
    for number, path, function in citations(document.read_text()):
        source = ROOT / path
        if not source.is_file():
            missing.append(f"line {number}: {path} does not exist")
        elif function and not re.search(rf"^(async )?def {function}\(", source.read_text(), re.M):
            missing.append(f"line {number}: {path} has no test {function}")
    assert not missing, f"{document_id(document)} cites tests that are gone:\n" + "\n".join(missing)


# ---------------------------------------------------------------------------- shown commands

# Every fenced block with its language (so fences pair up in order); commands are read from
# shell blocks only: inline code names commands and flags in passing (`mur endpoint
# --replicas`), a block shows what a reader runs.
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)
SHELL = {"", "bash", "sh", "shell", "console"}
COMMAND = re.compile(
    r"^(?:\.venv/bin/)?(?:mur|(?:python|\.venv/bin/python) (?:run\.py|-m mur)) [-a-z]"
)
ASSIGNMENT = re.compile(r"^(\w+)=(.*)$")
LOOP = re.compile(r"^for (\w+) in ([^;]+); do\b")
# Words that stand for a value the reader chooses (`--profile P`, `A B`, `...`): not parsed.
PLACEHOLDER = re.compile(r"^(?:[A-Z]|\.\.\.|<[^>]*>|FOLDER|DIR|URL)$")


def _words(line: str, variables: dict[str, list[str]]) -> Iterator[list[str]]:
    """The command's words after `mur` (run.py: `solve`), once per value of each loop
    variable it uses (unquoted, so split into words as the shell does); optional
    `[--flag value]` parts included, `[a | b]` as its first."""
    for name, values in variables.items():
        if f"${name}" in line:
            rest = {k: v for k, v in variables.items() if k != name}
            for value in values:
                yield from _words(line.replace(f"${name}", value), rest)
            return
    line = re.sub(r"\s#.*$", "", line)
    line = re.sub(r"\[([^]|]*)(?:\|[^]]*)?\]", r"\1", line)
    words = shlex.split(line)
    if words[0].endswith("mur"):
        yield words[1:]
    else:  # python run.py ... is `mur solve`; python -m mur ... is `mur`
        yield ["solve", *words[2:]] if words[1] == "run.py" else words[3:]


def shown_commands(text: str) -> list[tuple[str, list[str]]]:
    """(the command as shown, its words after `mur`) for every `mur` command in the text's
    shell blocks; a block's `NAME=...` and `for NAME in ...; do` are followed."""
    found: list[tuple[str, list[str]]] = []
    for language, block in FENCE.findall(text):
        if language not in SHELL:
            continue
        variables: dict[str, list[str]] = {}
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if match := LOOP.match(line):
                variables[match[1]] = match[2].split()
            elif match := ASSIGNMENT.match(line):
                variables[match[1]] = [" ".join(shlex.split(match[2]))]
            elif COMMAND.match(line):
                found.extend((line, words) for words in _words(line, variables))
    return [
        (shown, words)
        for shown, words in found
        if len(words) > 1 and not any(PLACEHOLDER.match(word) for word in words)
    ]


class Parsed(Exception):
    """Raised once the command's parser accepted its words: nothing is run."""


@pytest.fixture
def parse_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every argparse parser stops the command right after a successful parse."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise Parsed(original(self, *args, **kwargs))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)


def test_the_command_reader_follows_blocks_loops_and_optional_parts() -> None:
    text = """
```json
{"a": 1}
```
Prose between blocks, `mur solve --dataset` in passing.
```bash
pair='--profile a --verifier-profile b'
for rule in mur random; do
  .venv/bin/mur solve --branch $rule \\
      $pair   # a comment
done
mur servers down [--profile cpu-tiny | --all]
mur compare A B --samples N
python run.py --strategy critic
mur
murmur x
```
```python
mur = build_graph()
```
"""
    assert [words for _, words in shown_commands(text)] == [
        ["solve", "--branch", "mur", "--profile", "a", "--verifier-profile", "b"],
        ["solve", "--branch", "random", "--profile", "a", "--verifier-profile", "b"],
        ["servers", "down", "--profile", "cpu-tiny"],
        ["solve", "--strategy", "critic"],
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=document_id)
def test_every_shown_command_parses(
    document: Path, parse_only: None, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = []
    for shown, words in shown_commands(document.read_text()):
        status: int | str | None
        try:
            status = mur.cli.main(words)
        except Parsed:
            continue
        except SystemExit as exit:
            status = exit.code
        if status == 0:  # --help
            continue
        error = capsys.readouterr().err.strip().splitlines()
        refused.append(f"{shown}\n    -> exit {status}: {error[-1] if error else ''}")
    assert not refused, f"{document_id(document)} shows commands that no longer parse:\n" + (
        "\n".join(refused)
    )
