"""records.jsonl: one JSON line per finished (question, gate, gamma, sample), appended at once.

A crash can only ever cut the last line short; reopening the store drops such a tail, so a
rerun with the same folder skips exactly what is done and never counts anything twice.

Full traces make about 8 KB a run, so a table of a thousand runs would be 8 MB of text in the
repository. Once records.jsonl passes PACK_AT bytes its records move into records.jsonl.gz
(about 7x smaller), rewritten whole beside itself and swapped in atomically; the plain file
then starts empty again. Readers take both files, so a folder is read the same at any moment.

Several `mur solve` processes may write into one folder at once (e.g. the random baseline started
while the main phase's last questions finish): every change to a folder's files happens under
its lock file (`.records.lock`), so a pack in one process never empties the plain file
between another's append and its own reading of it.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

from filelock import FileLock

from mur.evals.harness.run_record import RunRecord
from mur.servers.cli import OneLineParser

RECORDS = "records.jsonl"
PACKED = "records.jsonl.gz"
PACK_AT = 1 << 20  # bytes of plain records before they are packed
ERRORS = "errors.jsonl"
SETTINGS = "settings.json"
LOCK = ".records.lock"


class SettingsMismatchError(ValueError):
    """A folder's runs were made with other settings than the command asks for: resuming
    into it would mix two experiments in one table."""


class ErrorRecord(TypedDict):
    """One line of errors.jsonl: a run that failed, and why."""

    key: str
    error: str  # the exception's type
    message: str


def _complete_lines(path: Path) -> Iterator[RunRecord]:
    if not path.exists():
        return
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                return  # a line cut short by a crash: not a record
            yield json.loads(raw)


def _packed_lines(path: Path) -> Iterator[RunRecord]:
    if path.exists():
        with gzip.open(path, "rb") as handle:
            for raw in handle:
                yield json.loads(raw)


def _folder_records(folder: Path) -> list[RunRecord]:
    """Packed records, then plain ones; a record in both (a pack stopped between swapping
    the packed file in and emptying the plain one) counts once."""
    seen: set[str] = set()
    records = []
    for record in (*_packed_lines(folder / PACKED), *_complete_lines(folder / RECORDS)):
        if record["key"] not in seen:
            seen.add(record["key"])
            records.append(record)
    return records


def has_records(folder: str | os.PathLike[str]) -> bool:
    """Whether a benchmark has written into this folder (plain or packed records)."""
    return (Path(folder) / RECORDS).exists() or (Path(folder) / PACKED).exists()


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
        self.packed_path = self.folder / PACKED
        self.lock = FileLock(self.folder / LOCK)
        with self.lock:
            self.path.touch(exist_ok=True)
            self.dropped_bytes = _drop_partial_tail(self.path)
            self._pack_if_large()

    def load(self) -> list[RunRecord]:
        with self.lock:
            return _folder_records(self.folder)

    def pack(self) -> None:
        """Move every plain record into the packed file."""
        with self.lock:
            self._rewrite(self.load())

    def drop(self, gate: str) -> int:
        """Remove every run of one gate label (e.g. runs a since-fixed bug made), so that the
        next run of the folder's command records them again; returns how many were removed.
        A crash part-way can leave some of them in place: drop again."""
        with self.lock:
            records = self.load()
            kept = [record for record in records if record["gate"] != gate]
            if len(kept) < len(records):
                self._rewrite(kept)
        return len(records) - len(kept)

    def _rewrite(self, records: list[RunRecord]) -> None:
        """Make ``records`` the folder's records, all packed. The new packed file is written
        and synced beside the old one, then renamed over it; only then is the plain file
        emptied. A crash at any point leaves each record in at least one file, and load()
        counts a record found in both once."""
        partial = self.packed_path.with_name(PACKED + ".partial")
        with partial.open("wb") as raw:
            # mtime=0 and no file name: the same records give the same bytes.
            with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz:
                for record in records:
                    gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, self.packed_path)
        folder = os.open(self.folder, os.O_RDONLY)  # the rename itself on disk, then the truncate
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
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
            differ = {k: v for k, v in recorded.items() if k in settings and settings[k] != v}
            if differ:
                name = sorted(differ)[0]
                raise SettingsMismatchError(
                    f"{path} says the runs in {self.folder} were made with {name}="
                    f"{differ[name]!r}, this command asks {name}={settings[name]!r}"
                    + (f" (and {len(differ) - 1} more settings)" if len(differ) > 1 else "")
                    + ": pass the same settings to resume, or --out a new folder"
                )
            path.write_text(json.dumps({**recorded, **settings}, indent=2, sort_keys=True) + "\n")

    def done_keys(self) -> set[str]:
        return {record["key"] for record in self.load()}

    def _append(self, path: Path, record: RunRecord | ErrorRecord) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        # One write of one whole line, flushed to disk before the next question is counted.
        with self.lock, path.open("ab") as handle:
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
    skipped)."""
    if not has_records(folder):
        raise FileNotFoundError(f"no {RECORDS} in {folder}: run a benchmark with --out {folder}")
    return _folder_records(Path(folder))


def records_so_far(folder: str | os.PathLike[str]) -> list[RunRecord]:
    """The complete records of a folder a benchmark may not have written into yet."""
    return load_records(folder) if has_records(folder) else []


def main(argv: Sequence[str] | None = None, prog: str = "mur records") -> int:
    """`mur records drop DIR --gate LABEL`: remove one gate's runs from a folder."""
    parser = OneLineParser(
        prog=prog,
        description="Maintain a run folder's records. drop: remove every run of one gate label "
        "(runs a since-fixed bug made), so that rerunning the folder's command.txt records "
        "them again.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    drop = commands.add_parser("drop", help="remove every run of one gate label")
    drop.add_argument("folder", type=Path)
    drop.add_argument("--gate", required=True, help="the label as recorded, e.g. random@0.218")
    args = parser.parse_args(argv)
    if not has_records(args.folder):
        print(f"{prog}: error: no {RECORDS} in {args.folder}: not a run folder", file=sys.stderr)
        return 2
    store = RecordStore(args.folder)
    dropped = store.drop(args.gate)
    if not dropped:
        gates = sorted({record["gate"] for record in store.load()})
        print(
            f"{prog}: error: {args.folder} has no runs of gate {args.gate!r} (its gates: "
            f"{', '.join(gates)})",
            file=sys.stderr,
        )
        return 2
    print(f"dropped {dropped} runs of {args.gate} from {args.folder}; rerun its command.txt "
          "to record them again")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
