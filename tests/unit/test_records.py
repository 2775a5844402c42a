"""The record store packs old records into gzip volumes (records.jsonl.gz, records.2.jsonl.gz,
...); readers see one folder."""

from __future__ import annotations

import contextlib
import gzip
import json
import multiprocessing
import os
import random
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from mur.cli import records as records_command
from mur.evals.harness import records as records_module
from mur.evals.harness.records import PACKED, RECORDS, RecordStore, has_records, load_records
from mur.evals.harness.run_record import JobKey, make_record

RESULTS = Path(__file__).resolve().parents[2] / "results"


def record(n: int) -> dict:
    return {"key": f"math500/{n}/critic/mur/0.9/0", "trace": "step " * 50, "n": n}


@pytest.fixture
def small_packs(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pack after about three records instead of a megabyte."""
    monkeypatch.setattr(records_module, "PACK_AT", 600)
    return 600


def test_records_past_the_limit_move_into_the_packed_file(tmp_path: Path, small_packs) -> None:
    store = RecordStore(tmp_path)
    for n in range(10):
        store.append(record(n))
        assert store.path.stat().st_size <= small_packs + len(str(record(n))) + 10
    assert (tmp_path / PACKED).exists()
    assert [r["n"] for r in load_records(tmp_path)] == list(range(10))
    assert store.done_keys() == {record(n)["key"] for n in range(10)}
    # A resumed store sees the packed runs as done.
    assert RecordStore(tmp_path).done_keys() == store.done_keys()


def _append_records(folder: Path, first: int, count: int) -> None:
    store = RecordStore(folder)
    for n in range(first, first + count):
        store.append(record(n))


def test_two_processes_writing_one_folder_lose_no_record(tmp_path: Path, small_packs) -> None:
    """Two run.py processes in one folder (e.g. the random phase beside the main one): with
    packs every few records, one process's pack must never empty the plain file under the
    other's append. Without the folder lock this loses records within a few hundred."""
    fork = multiprocessing.get_context("fork")  # keeps the small PACK_AT in the children
    writers = [fork.Process(target=_append_records, args=(tmp_path, n * 1000, 150)) for n in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    numbers = sorted(r["n"] for r in load_records(tmp_path))
    assert numbers == [*range(1000, 1150), *range(2000, 2150)]


def test_packing_is_reproducible_and_loses_nothing(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    for n in range(5):
        store.append(record(n))
    store.pack()
    first = (tmp_path / PACKED).read_bytes()
    assert store.path.stat().st_size == 0
    store.pack()  # nothing new: the same bytes, so git sees no change
    assert (tmp_path / PACKED).read_bytes() == first
    with gzip.open(tmp_path / PACKED, "rt") as handle:
        assert len(handle.read().splitlines()) == 5


def test_a_pack_stopped_before_emptying_the_plain_file_counts_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RecordStore(tmp_path)
    for n in range(4):
        store.append(record(n))
    plain = store.path.read_bytes()
    store.pack()
    store.path.write_bytes(plain)  # as if the crash came between the swap and the truncate
    assert [r["n"] for r in load_records(tmp_path)] == [0, 1, 2, 3]
    store = RecordStore(tmp_path)
    store.append(record(4))
    store.pack()
    assert [r["n"] for r in load_records(tmp_path)] == [0, 1, 2, 3, 4]


def test_a_pack_stopped_while_writing_leaves_the_old_packed_file(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.append(record(0))
    store.pack()
    store.append(record(1))
    partial = tmp_path / (PACKED + ".partial")
    partial.write_bytes(b"\x1f\x8b half a gzip")  # the crash: a partial file, never swapped in
    assert [r["n"] for r in load_records(tmp_path)] == [0, 1]
    store.pack()
    assert not partial.exists()
    assert [r["n"] for r in load_records(tmp_path)] == [0, 1]


def test_a_folder_with_only_packed_records_reads_and_resumes(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.append(record(0))
    store.pack()
    os.remove(tmp_path / RECORDS)  # a clone of a folder whose plain file was left out
    assert has_records(tmp_path)
    assert [r["n"] for r in load_records(tmp_path)] == [0]
    assert RecordStore(tmp_path).done_keys() == {record(0)["key"]}


def test_a_folder_without_records_says_so(tmp_path: Path) -> None:
    assert not has_records(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no records\.jsonl"):
        load_records(tmp_path)


def test_an_empty_records_file_is_no_run_folder_yet(tmp_path: Path) -> None:
    RecordStore(tmp_path)  # a run that has not finished its first question
    assert has_records(tmp_path) and records_module.records_so_far(tmp_path) == []
    with pytest.raises(FileNotFoundError, match=r"records\.jsonl holds no records yet"):
        load_records(tmp_path)


def add_line(folder: Path, text: str) -> None:
    with (folder / RECORDS).open("a") as plain:
        plain.write(text + "\n")


def cut_volume(folder: Path) -> None:
    (folder / PACKED).write_bytes((folder / PACKED).read_bytes()[:-30])


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda f: add_line(f, "[1, 2]"), r"records\.jsonl line 2 is not a run record"),
        (lambda f: add_line(f, "{}"), r"records\.jsonl line 2 is not a run record"),
        (lambda f: add_line(f, "oops"), r"records\.jsonl line 2 is not JSON"),
        (cut_volume, r"records\.jsonl\.gz is cut short or not gzip"),
        (lambda f: (f / PACKED).write_text("hello"), r"records\.jsonl\.gz is cut short"),
    ],
)
def test_a_damaged_records_file_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, says: str
) -> None:
    """A line edited by hand or a volume cut short by a copy: one line naming the file (and
    line) for every reader, never a table of what survived or a traceback."""
    store = RecordStore(tmp_path)
    store.append(gated(0, "never"))
    store.pack()
    with (tmp_path / RECORDS).open("a") as plain:
        plain.write(json.dumps(gated(1, "never")) + "\n")
    damage(tmp_path)
    with pytest.raises(records_module.CorruptRecordsError, match=says):
        load_records(tmp_path)
    assert records_command.main(["pack", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("mur records: error: ")


def gated(n: int, gate: str) -> dict:
    return {"key": f"math500/{n}/critic/{gate}/-/0", "gate": gate, "n": n}


def test_drop_removes_one_gates_runs_from_both_files(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    for n in range(3):
        store.append(gated(n, "random@0.2"))
        store.append(gated(n, "never"))
    store.pack()
    store.append(gated(3, "random@0.2"))  # one in the plain file too
    store.append(gated(3, "never"))
    assert store.drop("random@0.2") == 4
    assert [(r["gate"], r["n"]) for r in load_records(tmp_path)] == [("never", n) for n in range(4)]
    assert store.drop("random@0.2") == 0
    # A resumed run sees them as not done, so the folder's command records them again.
    assert gated(0, "random@0.2")["key"] not in RecordStore(tmp_path).done_keys()


def test_drop_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = RecordStore(tmp_path)
    store.append(gated(0, "random@0.2"))
    store.append(gated(0, "never"))
    assert records_command.main(["drop", str(tmp_path), "--gate", "random@0.2"]) == 0
    assert "dropped 1 runs of random@0.2" in capsys.readouterr().out
    assert records_command.main(["drop", str(tmp_path), "--gate", "mur"]) == 2
    assert "has no runs of gate 'mur' (its gates: never)" in capsys.readouterr().err
    RecordStore(fresh := tmp_path / "fresh").append(gated(0, "never"))
    assert records_command.main(["drop", str(fresh), "--gate", "mur"]) == 2
    assert not (fresh / PACKED).exists()  # refused before anything was packed
    capsys.readouterr()
    assert records_command.main(["drop", str(tmp_path / "none"), "--gate", "mur"]) == 2
    assert "not a run folder" in capsys.readouterr().err


def noisy(n: int) -> dict:
    """A record that compresses to about 1 KB (gzip barely shrinks random hex by half)."""
    return {"key": f"math500/{n}/critic/never/-/0", "gate": "never", "n": n,
            "trace": random.Random(n).randbytes(1000).hex()}  # fmt: skip


@pytest.fixture
def small_volumes(monkeypatch: pytest.MonkeyPatch) -> int:
    """Volumes of about 25 KB (10 KB, and the compressor's lag of about 15 KB; at most 40 KB)
    instead of 1.5 MB (2 MB); packs every 8 KB."""
    monkeypatch.setattr(records_module, "PACK_AT", 8_000)
    monkeypatch.setattr(records_module, "VOLUME_AT", 10_000)
    monkeypatch.setattr(records_module, "VOLUME_MAX", 40_000)
    return 40_000


def volume_files(folder: Path) -> list[Path]:
    return [records_module._volume(folder, n) for n in records_module._volumes(folder)]


def packed_count(folder: Path) -> int:
    """Records on disk in the volumes, a record in two volumes counting twice."""
    return sum(len(gzip.open(path).read().splitlines()) for path in volume_files(folder))


def test_a_long_experiment_fills_volumes_one_after_another(tmp_path: Path, small_volumes) -> None:
    store = RecordStore(tmp_path)
    for n in range(60):
        store.append(noisy(n))
    full = {path: path.read_bytes() for path in volume_files(tmp_path)[:-1]}
    assert full
    for n in range(60, 100):
        store.append(noisy(n))
    store.pack()
    paths = volume_files(tmp_path)
    assert [p.name for p in paths[:3]] == [PACKED, "records.2.jsonl.gz", "records.3.jsonl.gz"]
    assert len(paths) >= 4 and all(p.stat().st_size <= small_volumes for p in paths)
    assert all(path.read_bytes() == content for path, content in full.items())  # left alone
    assert [r["n"] for r in load_records(tmp_path)] == list(range(100))
    assert packed_count(tmp_path) == 100 and store.path.stat().st_size == 0
    assert RecordStore(tmp_path).done_keys() == {noisy(n)["key"] for n in range(100)}


def test_a_volume_packed_whole_is_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder packed before volumes existed (one records.jsonl.gz over the limit)."""
    store = RecordStore(tmp_path)
    for n in range(60):
        store.append(noisy(n))
    store.pack()
    assert len(volume_files(tmp_path)) == 1
    monkeypatch.setattr(records_module, "VOLUME_AT", 10_000)
    monkeypatch.setattr(records_module, "VOLUME_MAX", 40_000)
    assert records_command.main(["pack", str(tmp_path)]) == 0
    paths = volume_files(tmp_path)
    assert f"{tmp_path}: 60 records in {len(paths)} volumes of " in capsys.readouterr().out
    assert len(paths) >= 3 and all(p.stat().st_size <= 40_000 for p in paths)
    assert [r["n"] for r in load_records(tmp_path)] == list(range(60))
    assert packed_count(tmp_path) == 60


class Crash(Exception):
    pass


def crash_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Stop the process (raise Crash) before its ``step``-th change to the folder on disk: a
    rename, a removal or the emptying of the plain file."""
    steps = iter(range(1_000_000))

    def before(change):
        def changed(*args, **kwargs):
            if next(steps) == step:
                raise Crash
            return change(*args, **kwargs)

        return changed

    monkeypatch.setattr(os, "replace", before(os.replace))
    monkeypatch.setattr(os, "unlink", before(os.unlink))
    empty = RecordStore._empty_plain_file
    monkeypatch.setattr(RecordStore, "_empty_plain_file", lambda self: before(empty)(self))


def test_a_split_cut_short_at_any_step_loses_nothing_and_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash the split of an oversized volume before each of its disk changes, then crash the
    pack that follows before each of its own: every record is read exactly once at every
    point, and a last pack leaves every volume under the limit with no record twice."""
    start = RecordStore(tmp_path / "start")
    for n in range(60):
        start.append(noisy(n))
    start.pack()  # one volume of about 60 KB
    start.append(noisy(60))  # and one plain record
    for first_crash in range(8):
        for second_crash in range(8):
            folder = shutil.copytree(start.folder, tmp_path / f"{first_crash}-{second_crash}")
            with monkeypatch.context() as patch:
                patch.setattr(records_module, "VOLUME_AT", 10_000)
                patch.setattr(records_module, "VOLUME_MAX", 40_000)
                for crash in (first_crash, second_crash):
                    with monkeypatch.context() as crashing:
                        crash_at(crashing, crash)
                        # The process dies at the crash; what it left is read below.
                        with contextlib.suppress(Crash):
                            RecordStore(folder).pack()
                    read = [r["n"] for r in load_records(folder)]
                    assert read == list(range(61)), (first_crash, second_crash)
                RecordStore(folder).pack()
                assert all(p.stat().st_size <= 40_000 for p in volume_files(folder))
            assert [r["n"] for r in load_records(folder)] == list(range(61))
            assert packed_count(folder) == 61, (first_crash, second_crash)


@pytest.mark.parametrize("resumed", [False, True])
def test_the_writer_makes_the_committed_records_byte_for_byte(resumed: bool) -> None:
    """The typed record keeps the file's format: a committed line, taken apart and written
    again by make_record, is the same bytes (`resumed` goes after finished_at)."""
    folder = RESULTS / "math500-critic-qwen2.5-coder-1.5b"
    with gzip.open(folder / PACKED, "rb") as packed:
        line = packed.readline().rstrip(b"\n")
    old = json.loads(line)
    if resumed:
        old = {
            **{k: v for k, v in old.items() if k != "trace"},
            "resumed": True,
            "trace": old["trace"],
        }
    key = JobKey(
        old["dataset"], old["problem_id"], old["strategy"], old["gate"], old["gamma"], old["sample"]
    )
    new = make_record(
        key,
        old["gold"],
        {"question": "not recorded", **old["trace"]},
        old["correct"],
        old["latency_s"],
        finished_at=datetime.fromisoformat(old["finished_at"]),
        resumed=resumed,
    )
    assert json.dumps(new, ensure_ascii=False) == json.dumps(old, ensure_ascii=False)
    if not resumed:
        assert json.dumps(new, ensure_ascii=False).encode() == line
