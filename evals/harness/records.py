"""records.jsonl: one JSON line per finished (question, gate, gamma, sample), appended at once.

A crash can only ever cut the last line short; reopening the store drops such a tail, so a
rerun with the same folder skips exactly what is done and never counts anything twice.

Full traces make large records, so once records.jsonl passes PACK_AT bytes its records move
into gzip volumes (records.jsonl.gz, then records.2.jsonl.gz, ...) and the plain file starts
empty again. A pack rewrites only the last volume, beside itself, and swaps it in atomically;
once a volume passes VOLUME_AT bytes the next one starts, so no file outgrows what a
repository should hold and a pack's work stays small. Readers take every file, a record found
twice counting once, so a folder is read the same at any moment.

Several `mur solve` processes may write into one folder at once: every change to a folder's
files happens under its lock file (`.records.lock`), so a pack in one process never empties
the plain file between another's append and its own reading of it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

from filelock import FileLock

from mur.evals.harness.run_record import RunRecord

RECORDS = "records.jsonl"
PACKED = "records.jsonl.gz"
PACK_AT = 1 << 20  # bytes of plain records before they are packed
VOLUME_AT = 1_500_000  # bytes of a packed volume before the next one starts
VOLUME_MAX = 2_000_000  # bytes no volume should pass: a repository's limit for one file
ERRORS = "errors.jsonl"
SETTINGS = "settings.json"
LOCK = ".records.lock"


class SettingsMismatchError(ValueError):
    """A folder's runs were made with other settings than the command asks for: resuming
    into it would mix two experiments in one table."""


def describe_differences(
    names: Iterable[str], recorded: Mapping[str, Any], asked: Mapping[str, Any]
) -> str:
    """The first differing setting by name, as "name=recorded, this command asks name=asked",
    and how many more differ: what a refused resume says (a setting absent from one side shows
    as None)."""
    first, *more = sorted(names)
    shown = f"{first}={recorded.get(first)!r}, this command asks {first}={asked.get(first)!r}"
    return f"{shown} (and {len(more)} more settings)" if more else shown


class ErrorRecord(TypedDict):
    """One line of errors.jsonl: a run that failed, and why."""

    key: str
    error: str  # the exception's type
    message: str  # the line `mur solve` prints for it (graphs.model_calls.describe_failure)


class CorruptRecordsError(ValueError):
    """A records file that is not what a run writes (a line edited by hand, a volume cut
    short by a copy): reading on would make a table of whatever survived, silently."""


def _record(raw: bytes, path: Path, line: int) -> RunRecord:
    """One line of a records file as a run record, or an error naming the file and line."""
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptRecordsError(
            f"{path} line {line} is not JSON ({exc}): fix or delete that line"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("key"), str):
        raise CorruptRecordsError(
            f"{path} line {line} is not a run record (a JSON object with a key): fix or "
            "delete that line"
        )
    return cast(RunRecord, record)


def _lines(path: Path) -> Iterator[RunRecord]:
    """The records of a plain file (a last line cut short by a crash is not one) or of a packed
    volume (.gz: cut short or not gzip is an error)."""
    if not path.exists():
        return
    packed = path.suffix == ".gz"
    try:
        with gzip.open(path, "rb") if packed else path.open("rb") as handle:
            for line, raw in enumerate(handle, start=1):
                if not (packed or raw.endswith(b"\n")):
                    return
                yield _record(raw, path, line)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        if not packed:
            raise
        raise CorruptRecordsError(
            f"{path} is cut short or not gzip ({exc}): restore it (`git checkout -- {path}`) "
            "or move it away, and its runs are run again"
        ) from None


def _volume(folder: Path, number: int) -> Path:
    """Packed volume ``number`` (from 1): records.jsonl.gz, records.2.jsonl.gz, ..."""
    return folder / (PACKED if number == 1 else f"records.{number}.jsonl.gz")


def _volumes(folder: Path) -> list[int]:
    """The numbers of a folder's packed volumes, in order."""
    numbers = [1] if (folder / PACKED).exists() else []
    for path in folder.glob("records.*.jsonl.gz"):
        middle = path.name[len("records.") : -len(".jsonl.gz")]
        if middle.isdigit() and int(middle) >= 2:
            numbers.append(int(middle))
    return sorted(numbers)


def _each_key_once(records: Iterable[RunRecord], seen: set[str]) -> list[RunRecord]:
    """The first record of each key not yet in ``seen`` (which it fills), in order."""
    kept = []
    for record in records:
        if record["key"] not in seen:
            seen.add(record["key"])
            kept.append(record)
    return kept


def _folder_records(folder: Path) -> list[RunRecord]:
    """Packed records, volume by volume, then plain ones; a record in two files (a pack
    stopped between swapping a volume in and emptying the plain file) counts once."""
    packed = (r for number in _volumes(folder) for r in _lines(_volume(folder, number)))
    return _each_key_once((*packed, *_lines(folder / RECORDS)), set())


def has_records(folder: str | os.PathLike[str]) -> bool:
    """Whether an evaluation has written into this folder (plain or packed records)."""
    return (Path(folder) / RECORDS).exists() or bool(_volumes(Path(folder)))


def _compressed(records: Sequence[RunRecord], limit: int | None = None) -> list[bytes]:
    """``records`` as gzip volumes in order, each started anew once the one before passes
    ``limit`` bytes (at least one volume, empty for no records; one volume without a limit).
    Level 9, mtime 0 and no file name: the same records give the same bytes, so git sees no
    change where there is none."""
    volumes: list[bytes] = []
    buffer = io.BytesIO()
    gz = gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0)
    for record in records:
        # What the compressor has let out so far: it holds back up to about 20 KB, which
        # VOLUME_MAX leaves room for.
        if limit is not None and buffer.tell() >= limit:
            gz.close()
            volumes.append(buffer.getvalue())
            buffer = io.BytesIO()
            gz = gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0)
        gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
    gz.close()
    volumes.append(buffer.getvalue())
    return volumes


def _drop_partial_tail(path: Path) -> int:
    """Truncate a last line without its newline; returns the bytes dropped."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as handle:
        handle.seek(max(0, size - 1))
        if handle.read(1) == b"\n":
            return 0
        handle.seek(0)
        keep = handle.read().rfind(b"\n") + 1
        handle.truncate(keep)
        return size - keep


class RecordStore:
    """Append-only records with resume: what is in the file is done."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / RECORDS
        self.errors_path = self.folder / ERRORS
        self.lock = FileLock(self.folder / LOCK)
        with self.lock:
            self.path.touch(exist_ok=True)
            self.dropped_bytes = _drop_partial_tail(self.path)
            self._pack_if_large()

    def volume_paths(self) -> list[Path]:
        """The packed volumes' files, in order."""
        return [_volume(self.folder, number) for number in _volumes(self.folder)]

    def load(self) -> list[RunRecord]:
        with self.lock:
            return _folder_records(self.folder)

    def pack(self) -> None:
        """Move every plain record into the packed volumes: into the last one while it is
        under VOLUME_AT, else into a new one. Volumes out of shape (over VOLUME_MAX, or
        repeating an earlier one's records after a pack a crash cut short) are rewritten from
        the first of them on. Each file changes by one atomic swap, in an order that keeps
        every record in at least one file at every moment: new volumes, the first rewritten
        one, removal of those it replaced, then the emptying of the plain file (load() counts
        a record found twice once; a gap in volume numbers is harmless)."""
        with self.lock:
            volumes = {n: list(_lines(_volume(self.folder, n))) for n in _volumes(self.folder)}
            first = self._first_to_rewrite(volumes)
            seen = {r["key"] for n, records in volumes.items() if n < first for r in records}
            replaced = [number for number in volumes if number >= first]
            records = _each_key_once(  # the replaced volumes' records, then the plain ones
                (*(r for n in replaced for r in volumes[n]), *_lines(self.path)), seen
            )
            chunks = _compressed(records, VOLUME_AT)
            after = max([first, *volumes])
            for offset, chunk in enumerate(chunks[1:], start=1):
                self._swap_in(_volume(self.folder, after + offset), chunk)
            self._swap_in(_volume(self.folder, first), chunks[0])
            for number in reversed(replaced[1:]):  # from the end: what stays keeps its order
                _volume(self.folder, number).unlink()
            self._sync_folder()
            self._empty_plain_file()

    def _first_to_rewrite(self, volumes: dict[int, list[RunRecord]]) -> int:
        """The first volume a pack rewrites (a new number when the last one is full); the
        volumes before it stay as they are."""
        seen: set[str] = set()
        last = max(volumes, default=0)
        for number, records in volumes.items():
            size = _volume(self.folder, number).stat().st_size
            keys = [record["key"] for record in records]
            if size > VOLUME_MAX or not seen.isdisjoint(keys):
                return number
            if number == last and size < VOLUME_AT:
                return number
            seen.update(keys)
        return last + 1

    def drop(self, gate: str) -> int:
        """Remove every run of one gate label (e.g. runs a since-fixed bug made), so that the
        next run of the folder's command records them again; returns how many were removed.
        Each volume is rewritten on its own: a crash part-way can leave some of them in
        place: drop again."""
        with self.lock:
            self.pack()
            dropped = 0
            for number in _volumes(self.folder):
                path = _volume(self.folder, number)
                records = list(_lines(path))
                kept = [record for record in records if record["gate"] != gate]
                if len(kept) < len(records):
                    self._swap_in(path, _compressed(kept)[0])
                    dropped += len(records) - len(kept)
        return dropped

    def _swap_in(self, path: Path, content: bytes) -> None:
        """Make ``content`` the file at ``path``: written and synced beside it, renamed over
        it, and the rename itself synced, so a crash leaves the old file or the new one."""
        if path.exists() and path.read_bytes() == content:
            return  # a full volume packed again: nothing to write
        partial = path.with_name(path.name + ".partial")
        with partial.open("wb") as raw:
            raw.write(content)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, path)
        self._sync_folder()

    def _sync_folder(self) -> None:
        """Put the folder's renames and removals on disk before what depends on them."""
        folder = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def _empty_plain_file(self) -> None:
        """After its records are in a volume on disk; load() counts one found in both once."""
        with self.path.open("r+b") as handle:
            handle.truncate(0)
            os.fsync(handle.fileno())

    def _pack_if_large(self) -> None:
        if self.path.stat().st_size > PACK_AT:
            self.pack()

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Refuse settings other than those the folder's runs were made with (settings.json,
        written by its first run); then record them. A setting the file does not name yet (a
        field added since) is taken as it comes."""
        path = self.folder / SETTINGS
        with self.lock:
            recorded = json.loads(path.read_text()) if path.exists() else {}
            differ = [k for k, v in recorded.items() if k in settings and settings[k] != v]
            if differ:
                raise SettingsMismatchError(
                    f"{path} says the runs in {self.folder} were made with "
                    f"{describe_differences(differ, recorded, settings)}: pass the same "
                    "settings to resume, or --out a new folder"
                )
            path.write_text(json.dumps({**recorded, **settings}, indent=2, sort_keys=True) + "\n")

    def done_keys(self) -> set[str]:
        return {record["key"] for record in self.load()}

    def _append(self, path: Path, record: RunRecord | ErrorRecord) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        # One write of one whole line, flushed to disk before the next question is counted.
        with self.lock:
            # A line cut short here can only be a writer's that died mid-write (a killed
            # `--workers` process, while the others go on): appended to, it would join this
            # record into one line no reader takes.
            if path.exists():
                _drop_partial_tail(path)
            with path.open("ab") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())

    def append(self, record: RunRecord) -> None:
        with self.lock:
            self._append(self.path, record)
            self._pack_if_large()

    def append_error(self, record: ErrorRecord) -> None:
        self._append(self.errors_path, record)


def load_records(folder: str | os.PathLike[str]) -> list[RunRecord]:
    """The complete records of a run folder, packed and plain (read-only; a cut-short tail is
    skipped); a folder without any is an error."""
    if not has_records(folder):
        raise FileNotFoundError(f"no {RECORDS} in {folder}: run an evaluation with --out {folder}")
    records = _folder_records(Path(folder))
    if not records:
        raise FileNotFoundError(
            f"{Path(folder) / RECORDS} holds no records yet: its run has not finished a question"
        )
    return records


def records_so_far(folder: str | os.PathLike[str]) -> list[RunRecord]:
    """The complete records of a folder an evaluation may not have written into yet."""
    return _folder_records(Path(folder)) if has_records(folder) else []
