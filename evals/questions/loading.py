"""Loading benchmarks as ``Problem`` records, from a data folder or the Hugging Face hub.

The public sets ship in ``evals/questions/data`` (sources, licences and hashes in its README);
a set that must not (GPQA-diamond) is read from a folder the user names or ``../shared/data``
(see ``resolve_data_dir``). ``"hf"`` loads the same benchmarks from the hub. What a benchmark
is (files, hub source, system prompt, parser) comes from its registry entry
(evals.questions.datasets); nothing here names one.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mur.evals.questions.datasets import REGISTRY, check_dataset
from mur.evals.questions.problem import (
    DataNotFoundError,
    Dataset,
    DatasetError,
    Fields,
    MalformedRecordError,
    Problem,
)

#: Where the public benchmarks ship (package data).
SHIPPED_DATA_DIR = Path(__file__).resolve().parent / "data"
#: Environment variable naming the data directory (or ``hf``).
DATA_DIR_ENV = "MUR_DATA_DIR"
#: The ``data_dir`` value that loads from the Hugging Face hub.
HF_SOURCE = "hf"

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Where a set that is not shipped is looked for by default: a shared data folder next to the
# project root, outside the repository.
_SHARED_DATA_DIR = _PROJECT_ROOT.parent / "shared" / "data"
_WHERE_TO_POINT = (
    f"pass --data-dir DIR (data_dir=...) or set {DATA_DIR_ENV}=DIR to the folder holding "
    + ", ".join(entry.files[0] for entry in REGISTRY.values())
    + f", or use '{HF_SOURCE}' to load from the Hugging Face hub; with neither set, the "
    + ", ".join(entry.title for entry in REGISTRY.values() if entry.public)
    + f" files come from the copies shipped in {SHIPPED_DATA_DIR}"
)


def _not_shipped(entry: Dataset) -> str:
    """Where to put a benchmark that is not shipped, and why it is not."""
    return (
        f"{entry.title} is not shipped with the project ({entry.access}): put "
        f"{entry.files[0]} in {_SHARED_DATA_DIR}, or pass --data-dir DIR / set "
        f"{DATA_DIR_ENV}=DIR to a folder holding it, or use --data-dir {HF_SOURCE}"
    )


def resolve_data_dir(
    data_dir: str | os.PathLike[str] | None = None, name: str | None = None
) -> Path | str:
    """Where benchmark ``name`` comes from: a directory, or ``HF_SOURCE`` for the hub.

    Order: ``data_dir``; else ``$MUR_DATA_DIR`` (either one is used for every benchmark);
    else the shipped ``SHIPPED_DATA_DIR`` for the public sets (and when ``name`` is None),
    and ``../shared/data`` next to the project root for the others (GPQA). Raises
    ``DataNotFoundError`` naming the path, or for a set not shipped where to put it, when none
    is usable.
    """
    origin = "data_dir"
    if data_dir is None or str(data_dir) == "":
        data_dir, origin = os.environ.get(DATA_DIR_ENV, ""), f"${DATA_DIR_ENV}"
    if str(data_dir) == "":
        if name is None or check_dataset(name).public:
            return SHIPPED_DATA_DIR
        if _SHARED_DATA_DIR.is_dir():
            return _SHARED_DATA_DIR
        raise DataNotFoundError(
            f"{_SHARED_DATA_DIR} does not exist; {_not_shipped(check_dataset(name))}"
        )
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
    """The local file benchmark ``name`` is read from (see ``resolve_data_dir``). Raises
    ``DataNotFoundError`` saying where to put it when it is absent, and ``DatasetError`` when
    the source is the hub rather than a file."""
    entry = check_dataset(name)
    source = resolve_data_dir(data_dir, entry.name)
    if source == HF_SOURCE:
        raise DatasetError(
            f"benchmark {entry.name!r} is read from the Hugging Face hub, not a file"
        )
    candidates = [Path(source) / file_name for file_name in entry.files]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        where = _WHERE_TO_POINT if entry.public else _not_shipped(entry)
        raise DataNotFoundError(f"{candidates[0]} not found (benchmark {entry.name!r}); {where}")
    return path


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    limit: int | None = None,
    offset: int = 0,
) -> list[Problem]:
    """Load benchmark ``name`` (a registry entry's name) as a list of ``Problem``, in file order.

    ``data_dir``: see ``resolve_data_dir`` (``"hf"`` for the hub). ``offset``: skip the first
    ``offset`` problems (questions 201-400 are offset 200, limit 200); ``limit``: keep only the
    first ``limit`` after them. Raises ``ValueError`` for an unknown name or an offset past the
    last question, ``DataNotFoundError`` for a missing directory or file, and
    ``MalformedRecordError`` (with file and line) for a bad record."""
    entry = check_dataset(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    source = resolve_data_dir(data_dir, entry.name)
    records = (
        _hf_records(entry)
        if source == HF_SOURCE
        else _file_records(dataset_file(entry.name, source))
    )
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for index, (where, line, record) in enumerate(records):
        if limit is not None and len(problems) >= limit:
            break
        problem = entry.problem(entry.parse(Fields(record, where, line), index))
        if problem.id in seen:
            raise MalformedRecordError(
                where, line, f"duplicate id {problem.id!r} (first on line {seen[problem.id]})"
            )
        seen[problem.id] = line
        if index >= offset:
            problems.append(problem)
    if offset and not problems and limit != 0:
        raise ValueError(
            f"offset {offset} skips every question of {entry.name}, which has {len(seen)}: "
            f"give an offset below {len(seen)}"
        )
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


def _hf_records(entry: Dataset) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(hub source, row number, record) for each row of the benchmark on the hub."""
    try:
        hf_datasets = importlib.import_module("datasets")
    except ImportError as exc:
        raise DatasetError(
            "loading benchmarks from the Hugging Face hub needs the `datasets` package "
            "(pip install datasets); or use local files with --data-dir DIR or "
            f"{DATA_DIR_ENV}=DIR"
        ) from exc
    for source in entry.hub:
        label = source.label
        try:
            rows = hf_datasets.load_dataset(source.repo, source.config, split=source.split)
        except Exception as exc:  # the hub client raises many types: network, auth, gating
            raise DatasetError(
                f"cannot load {label} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
                "Check the network (HF_HUB_OFFLINE must be unset)"
                + (f"; {entry.title}: {entry.access}" if entry.access else "")
                + f". Or use local files with --data-dir DIR or {DATA_DIR_ENV}=DIR"
            ) from exc
        for row, record in enumerate(rows, start=1):
            yield label, row, dict(record)
