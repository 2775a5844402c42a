"""Benchmark loaders: MATH-500, AIME 2024, AIME 2025 and GPQA-diamond as ``Problem`` records.

The public sets (MATH-500, AIME 2024, AIME 2025) ship in ``evals/data`` (sources, licences and
hashes in its README); GPQA-diamond never does and is read from a folder the user names or
``../shared/data`` (see ``resolve_data_dir``). ``"hf"`` loads the same benchmarks from the
Hugging Face hub. GPQA's choices are unlettered in the source, so they are shuffled here
with a permutation derived from each question's Record ID: the same letters on every machine,
Python version and run, which keeps results comparable.

GPQA's authors ask that its questions never appear in plain text online: ``Problem`` leaves
``question`` and ``metadata`` out of its ``repr``, and no error message here quotes a record.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "HF_SOURCE",
    "PUBLIC_DATASETS",
    "SHIPPED_DATA_DIR",
    "SYSTEM_PROMPTS",
    "DataNotFoundError",
    "DatasetError",
    "MalformedRecordError",
    "Problem",
    "dataset_file",
    "load_dataset",
    "resolve_data_dir",
]

#: The benchmark names ``load_dataset`` accepts.
DATASETS: tuple[str, ...] = ("math500", "aime24", "aime25", "gpqa_diamond")
#: The benchmarks whose files ship inside the project (GPQA's authors ask it never be).
PUBLIC_DATASETS: tuple[str, ...] = ("math500", "aime24", "aime25")
#: Where the public benchmarks ship (package data).
SHIPPED_DATA_DIR = Path(__file__).resolve().parent / "data"
#: Environment variable naming the data directory (or ``hf``).
DATA_DIR_ENV = "MUR_DATA_DIR"
#: The ``data_dir`` value that loads from the Hugging Face hub.
HF_SOURCE = "hf"

_AIME_SYSTEM = "You are a helpful math assistant."
_GPQA_SYSTEM = 'You are a helpful assistant. Please answer "A", "B", "C", or "D".'
#: System prompt per dataset (the MUR contract); None means no system message.
SYSTEM_PROMPTS: dict[str, str | None] = {
    "math500": None,
    "aime24": _AIME_SYSTEM,
    "aime25": _AIME_SYSTEM,
    "gpqa_diamond": _GPQA_SYSTEM,
}

_FILES: dict[str, tuple[str, ...]] = {
    "math500": ("math500.jsonl",),
    "aime24": ("aime24.jsonl",),
    "aime25": ("aime25.jsonl",),
    "gpqa_diamond": ("gpqa_diamond.jsonl.gz", "gpqa_diamond.jsonl"),
}
# (repository, config, split) on the Hugging Face hub, read in this order.
_HF_SOURCES: dict[str, tuple[tuple[str, str | None, str], ...]] = {
    "math500": (("HuggingFaceH4/MATH-500", None, "test"),),
    "aime24": (("HuggingFaceH4/aime_2024", None, "train"),),
    "aime25": (
        ("opencompass/AIME2025", "AIME2025-I", "test"),
        ("opencompass/AIME2025", "AIME2025-II", "test"),
    ),
    "gpqa_diamond": (("Idavidrein/gpqa", "gpqa_diamond", "train"),),
}
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
# GPQA's default place: a shared data folder next to the project root, outside the repository.
_SHARED_DATA_DIR = _PROJECT_ROOT.parent / "shared" / "data"
_LETTERS = "ABCD"
_WHERE_TO_POINT = (
    f"pass --data-dir DIR (data_dir=...) or set {DATA_DIR_ENV}=DIR to the folder holding "
    "math500.jsonl, aime24.jsonl, aime25.jsonl and gpqa_diamond.jsonl.gz, "
    f"or use '{HF_SOURCE}' to load from the Hugging Face hub; with neither set, MATH-500 and "
    f"AIME come from the copies shipped in {SHIPPED_DATA_DIR}"
)
_GPQA_NOT_SHIPPED = (
    "GPQA-diamond is not shipped with the project (its authors ask that it never appear in "
    f"plain text online): put gpqa_diamond.jsonl.gz in {_SHARED_DATA_DIR}, or pass "
    f"--data-dir DIR / set {DATA_DIR_ENV}=DIR to a folder holding it, or use --data-dir "
    f"{HF_SOURCE} (Idavidrein/gpqa is gated: accept its terms on the hub, then `hf auth login`)"
)


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


def resolve_data_dir(
    data_dir: str | os.PathLike[str] | None = None, name: str | None = None
) -> Path | str:
    """Where benchmark ``name`` comes from: a directory, or ``HF_SOURCE`` for the hub.

    Order: ``data_dir``; else ``$MUR_DATA_DIR`` (either one is used for every benchmark);
    else the shipped ``SHIPPED_DATA_DIR`` for the public sets (and when ``name`` is None),
    and ``../shared/data`` next to the project root for GPQA. Raises ``DataNotFoundError``
    naming the path, or for GPQA where to put it, when none is usable.
    """
    origin = "data_dir"
    if data_dir is None or str(data_dir) == "":
        data_dir, origin = os.environ.get(DATA_DIR_ENV, ""), f"${DATA_DIR_ENV}"
    if str(data_dir) == "":
        if name is None or name in PUBLIC_DATASETS:
            return SHIPPED_DATA_DIR
        if _SHARED_DATA_DIR.is_dir():
            return _SHARED_DATA_DIR
        raise DataNotFoundError(f"{_SHARED_DATA_DIR} does not exist; {_GPQA_NOT_SHIPPED}")
    if str(data_dir).strip().lower() == HF_SOURCE:
        return HF_SOURCE
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DataNotFoundError(
            f"benchmark data directory {path} (from {origin}) does not exist or is not a "
            f"directory; {_WHERE_TO_POINT}"
        )
    return path


def dataset_file(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The local file benchmark ``name`` is read from (see ``resolve_data_dir``).

    Raises ``DataNotFoundError`` saying where to put it when it is absent, and
    ``DatasetError`` when the source is the hub rather than a file.
    """
    key = _known(name)
    source = resolve_data_dir(data_dir, key)
    if source == HF_SOURCE:
        raise DatasetError(f"benchmark {key!r} is read from the Hugging Face hub, not a file")
    candidates = [Path(source) / file_name for file_name in _FILES[key]]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        where = _GPQA_NOT_SHIPPED if key not in PUBLIC_DATASETS else _WHERE_TO_POINT
        raise DataNotFoundError(f"{candidates[0]} not found (benchmark {key!r}); {where}")
    return path


def _known(name: str) -> str:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    return key


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    limit: int | None = None,
) -> list[Problem]:
    """Load benchmark ``name`` (one of ``DATASETS``) as a list of ``Problem``, in file order.

    ``data_dir``: see ``resolve_data_dir`` (``"hf"`` for the Hugging Face hub). ``limit``: keep
    only the first ``limit`` problems. Raises ``ValueError`` for an unknown name,
    ``DataNotFoundError`` for a missing directory or file, ``MalformedRecordError`` (with file
    and line) for a bad record.
    """
    key = _known(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    source = resolve_data_dir(data_dir, key)
    records = _hf_records(key) if source == HF_SOURCE else _file_records(dataset_file(key, source))
    build = _BUILDERS[key]
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for index, (where, line, record) in enumerate(records):
        if limit is not None and len(problems) >= limit:
            break
        problem = build(record, index, _Fields(record, where, line))
        if problem.id in seen:
            raise MalformedRecordError(
                where, line, f"duplicate id {problem.id!r} (first on line {seen[problem.id]})"
            )
        seen[problem.id] = line
        problems.append(problem)
    return problems


# --------------------------------------------------------------------------- sources


def _file_records(path: Path) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(file, line number, record) for each non-blank line of a benchmark's file."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    line = 0
    try:
        with opener(path, "rb") as handle:
            for line, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                yield str(path), line, _decode(raw, str(path), line)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataNotFoundError(
            f"cannot read {path} (after line {line}): {exc}; replace the file with an intact "
            f"copy or {_WHERE_TO_POINT}"
        ) from exc


def _decode(raw: bytes, source: str, line: int) -> dict[str, Any]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MalformedRecordError(source, line, f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        # exc.msg and the column only; str(exc) would be fine too, but never quote the record.
        raise MalformedRecordError(
            source, line, f"invalid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(record, dict):
        raise MalformedRecordError(
            source, line, f"expected a JSON object, got {type(record).__name__}"
        )
    return record


def _hf_records(name: str) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(hub source, row number, record) for each row of the benchmark on the hub."""
    try:
        hf_datasets = importlib.import_module("datasets")
    except ImportError as exc:
        raise DatasetError(
            "loading benchmarks from the Hugging Face hub needs the `datasets` package "
            "(pip install datasets); or use local files with --data-dir DIR or "
            f"{DATA_DIR_ENV}=DIR"
        ) from exc
    for repo, config, split in _HF_SOURCES[name]:
        label = f"hf:{repo}" + (f"/{config}" if config else "") + f"[{split}]"
        try:
            rows = hf_datasets.load_dataset(repo, config, split=split)
        except Exception as exc:  # the hub client raises many types: network, auth, gating
            raise DatasetError(
                f"cannot load {label} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
                "Check the network (HF_HUB_OFFLINE must be unset); Idavidrein/gpqa is gated: "
                "accept its terms on the hub and run `hf auth login`. Or use local files with "
                f"--data-dir DIR or {DATA_DIR_ENV}=DIR"
            ) from exc
        for row, record in enumerate(rows, start=1):
            yield label, row, dict(record)


# --------------------------------------------------------------------------- records


class _Fields:
    """Typed access to one record's fields, with errors that name the file and line."""

    def __init__(self, record: dict[str, Any], source: str, line: int) -> None:
        self.record, self.source, self.line = record, source, line

    def error(self, problem: str) -> MalformedRecordError:
        return MalformedRecordError(self.source, self.line, problem)

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


def _math500(record: dict[str, Any], index: int, fields: _Fields) -> Problem:
    return Problem(
        dataset="math500",
        id=fields.text("unique_id"),
        question=fields.text("problem"),
        answer=fields.text("answer"),
        system_prompt=SYSTEM_PROMPTS["math500"],
        metadata={"subject": record.get("subject"), "level": record.get("level")},
    )


_AIME_URL = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)")


def _aime24(record: dict[str, Any], index: int, fields: _Fields) -> Problem:
    metadata: dict[str, Any] = {"year": 2024}
    url = record.get("url")
    if isinstance(url, str):
        metadata["url"] = url
        match = _AIME_URL.search(url)
        if match:
            metadata.update(contest=match.group(2), number=int(match.group(3)))
    return Problem(
        dataset="aime24",
        id=fields.text("id") if "id" in record else str(index),
        question=fields.text("problem", "question"),
        answer=fields.integer_answer("answer"),
        system_prompt=SYSTEM_PROMPTS["aime24"],
        metadata=metadata,
    )


def _aime25(record: dict[str, Any], index: int, fields: _Fields) -> Problem:
    # Local ids "0"-"14" are AIME I and "15"-"29" AIME II; the hub copy has no ids and lists
    # AIME I then AIME II, so its row index gives the same ids.
    problem_id = fields.text("id") if "id" in record else str(index)
    metadata: dict[str, Any] = {"year": 2025}
    if problem_id.isdigit() and int(problem_id) < 30:
        number = int(problem_id)
        metadata.update(contest="I" if number < 15 else "II", number=number % 15 + 1)
    return Problem(
        dataset="aime25",
        id=problem_id,
        question=fields.text("problem", "question"),
        answer=fields.integer_answer("answer"),
        system_prompt=SYSTEM_PROMPTS["aime25"],
        metadata=metadata,
    )


def _gpqa(record: dict[str, Any], index: int, fields: _Fields) -> Problem:
    record_id = fields.text("Record ID")
    options = [fields.text("Correct Answer")] + [
        fields.text(f"Incorrect Answer {k}") for k in (1, 2, 3)
    ]
    order = _choice_order(record_id)
    choices = {letter: options[source] for letter, source in zip(_LETTERS, order, strict=True)}
    correct_letter = _LETTERS[order.index(0)]
    lettered = "\n".join(f"{letter}) {text}" for letter, text in choices.items())
    return Problem(
        dataset="gpqa_diamond",
        id=record_id,
        question=f"{fields.text('Question')}\n\n{lettered}",
        answer=correct_letter,
        system_prompt=SYSTEM_PROMPTS["gpqa_diamond"],
        metadata={
            "choices": choices,
            "correct_letter": correct_letter,
            "record_id": record_id,
            "domain": record.get("High-level domain"),
            "subdomain": record.get("Subdomain"),
        },
    )


def _choice_order(record_id: str) -> list[int]:
    """Which source option (0 = correct) goes under A, B, C, D for this question.

    A permutation from SHA-256 of the Record ID: stable across runs, machines and Python
    versions (unlike ``hash()`` or ``random``'s algorithms), uniform over the 24 orders.
    """
    return sorted(
        range(len(_LETTERS)),
        key=lambda option: hashlib.sha256(f"mur-gpqa:{record_id}:{option}".encode()).digest(),
    )


_BUILDERS: dict[str, Callable[[dict[str, Any], int, _Fields], Problem]] = {
    "math500": _math500,
    "aime24": _aime24,
    "aime25": _aime25,
    "gpqa_diamond": _gpqa,
}
