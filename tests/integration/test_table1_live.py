"""`mur experiment table1` end to end against the real CPU vLLM server: every phase of the
table (main gates, random at MUR's measured rate, the gamma sweep) into one folder, stopped
by a SIGTERM and finished by reruns that lose and repeat nothing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mur.evals.harness.records import load_records
from mur.nodes.gate_labels import STANDARD_LABELS as MAIN_GATES

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = 1  # every phase of the table needs only one; each question is a run per gate

pytestmark = pytest.mark.integration


def table1(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mur", "experiment", "table1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


def tiny_table(
    base_url: str, results: Path, data: Path, *, limit: int, concurrency: int
) -> tuple[str, ...]:
    """`mur experiment table1`'s arguments: a small critic table (sweep 0.5), tiny model."""
    return (
        "--strategies", "critic", "--limit", str(limit), "--sweep", "0.5",
        "--concurrency", str(concurrency), "--base-url", base_url, "--profile", "cpu-tiny",
        "--results", str(results), "--tag", "tiny",
        "--", "--data-dir", str(data),
        "--max-steps", "2", "--max-step-tokens", "32", "--judge-max-tokens", "16",
    )  # fmt: skip


def test_a_sigterm_stops_the_table_then_reruns_finish_every_phase_once(
    cpu_server, tmp_path: Path, test_data
) -> None:
    """One table, three commands: stopped by a SIGTERM after its first record (the questions
    in flight finish and are saved), finished by a rerun (every phase: main gates, random at
    MUR's measured rate, the gamma sweep), then found done by a third's dry run."""
    args = tiny_table(cpu_server.base_url, tmp_path, test_data, limit=QUESTIONS, concurrency=2)
    folder = tmp_path / "math500-critic-tiny"
    records_file = folder / "records.jsonl"
    table = subprocess.Popen(
        [sys.executable, "-m", "mur", "experiment", "table1", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not (records_file.exists() and records_file.read_text().strip()):
        assert table.poll() is None and time.monotonic() < deadline, "no record was written"
        time.sleep(0.2)
    table.send_signal(signal.SIGTERM)  # one: the questions in flight finish and are saved
    _, stderr = table.communicate(timeout=600)
    assert table.returncode == 130, stderr[-3000:]
    assert "SIGTERM: starting no new questions" in stderr
    assert "critic / main stopped; its finished questions are saved" in stderr
    saved = load_records(folder)
    assert 1 <= len(saved) < QUESTIONS * len(MAIN_GATES)
    assert not (folder / "errors.jsonl").exists()

    rest = table1(*args)
    assert rest.returncode == 0, rest.stderr[-3000:]
    records = load_records(folder)
    keys = [record["key"] for record in records]
    assert len(keys) == len(set(keys)) == QUESTIONS * (len(MAIN_GATES) + 2)
    labels = {(r["gate"], r["gamma"]) for r in records}
    random_labels = [gate for gate, _ in labels if gate.startswith("random@")]
    assert len(random_labels) == 1
    assert labels == {
        *((gate, 0.9 if gate in ("mur", "mur+bc") else None) for gate in MAIN_GATES),
        (random_labels[0], None),
        ("mur", 0.5),
    }
    assert len((folder / "command.txt").read_text().splitlines()) == 3
    # MUR's headline pairs it with the random run the table made at its rate.
    assert f"Against random at its rate (`{random_labels[0]}`" in (folder / "report.md").read_text()

    # Done: a third command would run nothing. Its dry run (one process, not four) reads each
    # phase's progress from the folder, and the random phase's command from MUR's records.
    planned = table1("--dry-run", *args)
    assert planned.returncode == 0, planned.stderr[-3000:]
    progress = re.findall(
        r"^# critic / (\w+) \((\d+) of (\d+) runs recorded\)$", planned.stdout, re.M
    )
    assert [phase for phase, _, _ in progress] == ["main", "random", "sweep"], planned.stdout
    assert all(done == total for _, done, total in progress), planned.stdout
    assert f"--gate {random_labels[0]}" in planned.stdout
    assert len(load_records(folder)) == len(records)
