"""The record store packs old records into records.jsonl.gz; readers see one folder."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
from datetime import datetime
from pathlib import Path

import pytest

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
    assert records_module.main(["drop", str(tmp_path), "--gate", "random@0.2"]) == 0
    assert "dropped 1 runs of random@0.2" in capsys.readouterr().out
    assert records_module.main(["drop", str(tmp_path), "--gate", "mur"]) == 2
    assert "has no runs of gate 'mur' (its gates: never)" in capsys.readouterr().err
    assert records_module.main(["drop", str(tmp_path / "none"), "--gate", "mur"]) == 2
    assert "not a run folder" in capsys.readouterr().err


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
