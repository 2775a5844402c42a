"""The types of the questions room: a `Problem`, the `Dataset` registry entry that makes them,
and the errors a loader raises.

GPQA's authors ask that its questions never appear in plain text online: ``Problem`` leaves
``question`` and ``metadata`` out of its ``repr``, and no error message quotes a record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Problem:
    """One benchmark question, ready to prompt and to grade.

    ``question`` is the exact user text (GPQA: with its lettered choices), ``answer`` the gold
    answer as a string (AIME: a plain integer such as "25"; GPQA: the correct letter), and
    ``metadata`` the source details (MATH: subject, level; AIME: year, contest, number;
    GPQA: ``choices`` letter -> text, ``correct_letter``, ``record_id``, domain, subdomain).
    """

    dataset: str
    id: str
    question: str = field(repr=False)
    answer: str
    system_prompt: str | None
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, hash=False)


class DatasetError(Exception):
    """A benchmark could not be loaded; the message says what to change."""


class DataNotFoundError(DatasetError, FileNotFoundError):
    """The data directory or a benchmark file is missing or unreadable."""


class MalformedRecordError(DatasetError, ValueError):
    """A record is not valid JSON or lacks a field; names the file and line."""

    def __init__(self, source: str, line: int, problem: str) -> None:
        self.source, self.line = source, line
        super().__init__(f"{source}, line {line}: {problem}")


class Fields:
    """Typed access to one source record's fields, with errors that name the file and line."""

    def __init__(self, record: dict[str, Any], source: str, line: int) -> None:
        self.record, self.source, self.line = record, source, line

    def error(self, problem: str) -> MalformedRecordError:
        return MalformedRecordError(self.source, self.line, problem)

    def has(self, key: str) -> bool:
        return key in self.record

    def get(self, key: str) -> Any:
        """A field as it is (None when absent): for metadata that may be missing."""
        return self.record.get(key)

    def text(self, *keys: str) -> str:
        """The first of ``keys`` present, as a non-empty string (ints are accepted)."""
        for key in keys:
            if key in self.record and self.record[key] is not None:
                value = self.record[key]
                if isinstance(value, bool) or not isinstance(value, str | int):
                    raise self.error(f"field {key!r} must be a string, got {type(value).__name__}")
                value = str(value).strip()
                if not value:
                    raise self.error(f"field {key!r} is empty")
                return value
        raise self.error(f"missing field {' or '.join(repr(k) for k in keys)}")

    def integer_answer(self, key: str) -> str:
        """An AIME answer as a canonical integer string ("025" -> "25")."""
        value = self.text(key)
        if not re.fullmatch(r"\d{1,4}", value):
            raise self.error(f"field {key!r} must be an integer 0-999, got {value!r}")
        return str(int(value))


class Parsed(NamedTuple):
    """What a dataset's parser reads from one source record (the entry adds the rest)."""

    id: str
    question: str
    answer: str
    metadata: Mapping[str, Any] = {}


class HubSplit(NamedTuple):
    """A split of a Hugging Face hub dataset: (repository, config or None, split)."""

    repo: str
    config: str | None
    split: str

    @property
    def label(self) -> str:
        return f"hf:{self.repo}" + (f"/{self.config}" if self.config else "") + f"[{self.split}]"


#: One source record (its fields, and its 0-based row index) -> the problem's parts.
Parser = Callable[[Fields, int], Parsed]
#: (the model's extracted answer, the gold answer) -> correct?
Grader = Callable[[str, str], bool]


@dataclass(frozen=True)
class Dataset:
    """One benchmark, the only place it is described: the loaders, the grader, `mur solve`'s
    `--dataset` help and the error messages all read this entry (evals.questions.datasets)."""

    name: str  # as --dataset takes it and records carry it
    title: str  # as people write it
    files: tuple[str, ...]  # file names in a data folder, tried in order
    hub: tuple[HubSplit, ...]  # where `--data-dir hf` reads it, in order
    system_prompt: str | None  # the MUR contract's system message (None: none)
    parse: Parser
    grade: Grader
    public: bool = True  # ships in evals/questions/data; False: never in the repository
    access: str = ""  # for a set that is not public: why, and how to get it

    @property
    def description(self) -> str:
        return self.title

    def problem(self, parsed: Parsed) -> Problem:
        return Problem(
            dataset=self.name,
            id=parsed.id,
            question=parsed.question,
            answer=parsed.answer,
            system_prompt=self.system_prompt,
            metadata=dict(parsed.metadata),
        )
