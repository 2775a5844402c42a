"""`mur solve --dataset ... --workers N` (evals.harness.pool, worker): the questions of one run
folder in N processes record what one process records, survive SIGKILL of the whole group or
of one worker, and stop on SIGINT/SIGTERM as one process does.

Each run goes to a fake OpenAI-compatible server (tests/faulty_server.py) whose every call
takes a while and whose answers are the same whoever asks, so records can be compared across
runs. Runs that are not killed as a whole run their parent in this process (a fresh interpreter
costs seconds of imports); the workers are always processes of their own. The parent's side
alone (hand-out, giving up, dead workers) is tested first, with workers that only speak the
protocol (tests/fake_worker.py), in milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

import mur.cli
from faulty_server import FaultyServer, faulty_server
from mur.cli import solve as solve_command
from mur.evals.harness.plan import EvaluationPlan, Job
from mur.evals.harness.pool import WorkerPool, run_in_workers, shares
from mur.evals.harness.records import RECORDS, RecordStore, load_records
from mur.evals.harness.runner import RunOutcome
from mur.evals.questions import load_dataset
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TEST_DATA = ROOT / "tests" / "data"
FAKE_WORKER = ROOT / "tests" / "fake_worker.py"
QUESTIONS = 12
IN_FLIGHT = 4  # --concurrency: 2 + 2 over two workers
# Each question is three calls (two steps, then the answer), each taking this long.
FAST = "slowstep:0.05:3"
SLOW = "slowstep:0.2:3"
# One worker alone would take 7 s for all 12: time for the other to start, however loaded
# the machine (two workers start together and import the same modules).
PACED = "slowstep:0.4:3"
# The first 14 calls answer, then every call hangs: the run freezes with 2 to 4 questions
# recorded (3 calls each) and 4 in flight, which hold the other 2 to 8 answered calls (at most
# 2 each), so at least one of them has a finished step checkpointed.
FREEZES = [FAST] * 14 + ["stall"]
FROZEN_CALLS = 14 + IN_FLIGHT  # every question in flight waiting on its hanging call
TIMING = ("latency_s", "finished_at", "resumed")  # what differs between two runs of a question


def solve_argv(server: FaultyServer, out: Path, workers: int) -> list[str]:
    return [
        "solve", "--strategy", "critic", "--gate", "never", "--dataset", "math500",
        "--data-dir", str(TEST_DATA), "--limit", str(QUESTIONS), "--max-steps", "6",
        "--concurrency", str(IN_FLIGHT), "--base-url", server.base_url, "--out", str(out),
        "--workers", str(workers),
    ]  # fmt: skip


def start_parent(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`mur ARGV` as a process of its own, leading a process group its workers join."""
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "mur", *argv],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def recorded_keys(folder: Path) -> list[str]:
    """The key of every line of records.jsonl, repeats included."""
    path = folder / RECORDS
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["key"] for line in lines if line.endswith("}")]


def outcomes(folder: Path) -> dict[str, dict[str, Any]]:
    """Each question's record but its timing: answer, grade, tokens, steps, trace."""
    return {
        record["key"]: {k: v for k, v in record.items() if k not in TIMING}
        for record in load_records(folder)
    }


def report_numbers(folder: Path) -> dict[str, Any]:
    """report.json without what measures time (wall clock per question, server busy time)."""
    report = json.loads((folder / "report.json").read_text())
    del report["run_time"]
    for row in report["rows"]:
        for field in ("wall_mean", "wall_p50", "wall_p95"):
            del row[field]
    return report


def worker_processes(parent: int) -> list[psutil.Process]:
    """The worker processes of the parent with this pid, first started first."""
    found = []
    for child in psutil.Process(parent).children():
        with contextlib.suppress(psutil.Error):
            if "--worker" in child.cmdline():
                found.append(child)
    return sorted(found, key=lambda process: process.create_time())


def talks_to(process: psutil.Process, server: FaultyServer) -> bool:
    """Whether the process holds a connection to the server (its clients keep one open)."""
    port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
    with contextlib.suppress(psutil.Error):
        return any(c.raddr and c.raddr.port == port for c in process.net_connections("tcp"))
    return False


def gone(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return process.status() == psutil.STATUS_ZOMBIE
    return True


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the same run made by one process, never stopped."""
    out = tmp_path_factory.mktemp("one-process")
    with faulty_server([FAST]) as server:
        assert mur.cli.main(solve_argv(server, out, 1)) == 0
    return out


def assert_same_run(folder: Path, uninterrupted: Path) -> None:
    """Every question recorded exactly once, as one uninterrupted process recorded it, and
    the same report."""
    assert sorted(recorded_keys(folder)) == sorted(recorded_keys(uninterrupted))
    assert outcomes(folder) == outcomes(uninterrupted)
    assert report_numbers(folder) == report_numbers(uninterrupted)


def test_the_concurrency_is_split_as_evenly_as_it_goes() -> None:
    assert shares(8, 3) == [3, 3, 2]
    assert shares(4, 2) == [2, 2]
    assert shares(5, 5) == [1] * 5
    assert sum(shares(17, 4)) == 17


# ------------------------------------------------ the parent's side, with protocol-only workers


def benchmark_jobs(questions: int) -> list[Job]:
    problems = tuple(load_dataset("math500", TEST_DATA, limit=questions))
    return EvaluationPlan(dataset="math500", strategy="critic", problems=problems).jobs()


def run_fake_workers(folder: Path, mode: str, jobs: list[Job]) -> RunOutcome:
    """The jobs in two tests/fake_worker.py processes, one question in flight each."""
    command = (sys.executable, str(FAKE_WORKER), mode, str(folder / "runs.log"))
    run = run_in_workers(
        jobs, RecordStore(folder), concurrency=2, pool=WorkerPool(2, command), show_progress=False
    )
    return asyncio.run(run)


def test_questions_go_to_whichever_worker_is_free(tmp_path: Path) -> None:
    """Not a split made in advance (6 + 6): the free worker takes what the busy one cannot.
    The busy one holds its first question until the other has answered the 11 others (the
    fake's `done:11`), so the split is the scheduler's, whatever the machine's speed."""
    jobs = benchmark_jobs(12)
    outcome = run_fake_workers(tmp_path, "done:11", jobs)
    assert outcome == RunOutcome(12, 0, 0, None)
    runs = [line.split() for line in (tmp_path / "runs.log").read_text().splitlines()]
    assert sorted(key for _, key in runs) == sorted(job.key.text for job in jobs)  # each once
    per_worker = sorted(Counter(pid for pid, _ in runs).values())
    assert per_worker == [1, 11], per_worker


def test_the_parent_gives_up_after_as_many_server_failures_as_one_process(tmp_path: Path) -> None:
    """concurrency + 2 failures in a row, counted across workers; then nothing new starts,
    and only the one still in flight ends."""
    outcome = run_fake_workers(tmp_path, "server_fails", benchmark_jobs(12))
    assert outcome.server_gone == "APIError: injected 500" and outcome.finished == 0
    assert 4 <= outcome.failed <= 5 and outcome.skipped == 12 - outcome.failed


def test_workers_that_die_before_they_are_ready_are_named_and_nothing_hangs(
    tmp_path: Path,
) -> None:
    outcome = run_fake_workers(tmp_path, "exit3", benchmark_jobs(4))
    assert (outcome.finished, outcome.failed, outcome.skipped) == (0, 0, 4)
    assert outcome.lost is not None
    deaths = sorted(outcome.lost.split("; "))
    assert len(deaths) == 2, deaths
    for number, death in enumerate(deaths, start=1):
        assert re.fullmatch(rf"worker {number} of 2 \(pid \d+\) exited with status 3", death)


def test_a_line_cut_short_by_a_killed_worker_is_dropped_before_the_next_append(
    tmp_path: Path,
) -> None:
    """One worker dies mid-write while the others go on appending: its half line must not
    swallow the next record (records.py drops it under the lock first)."""
    store = RecordStore(tmp_path)
    store.append({"key": "first"})
    with (tmp_path / RECORDS).open("ab") as handle:  # the killed worker's last write
        handle.write(b'{"key": "cut sh')
    store.append({"key": "second"})
    assert [record["key"] for record in load_records(tmp_path)] == ["first", "second"]


# ----------------------------------------------------------------- `mur solve --workers`, whole


def test_two_workers_record_what_one_process_records(
    tmp_path: Path, uninterrupted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same records (keys, answers, tokens, traces) and report; both workers asked the
    server (questions are handed out as slots free up, so each took some)."""
    seen: dict[int, bool] = {}  # worker pid: whether it asked the server
    done = threading.Event()
    with faulty_server([PACED]) as server:

        def watch() -> None:
            while not done.wait(0.02):
                for worker in worker_processes(os.getpid()):
                    seen[worker.pid] = seen.get(worker.pid, False) or talks_to(worker, server)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            assert mur.cli.main(solve_argv(server, tmp_path, 2)) == 0
        finally:
            done.set()
            watcher.join()
    assert "2 worker processes, 2 + 2 questions in flight" in capsys.readouterr().err
    assert len(seen) == 2 and all(seen.values()), seen
    assert_same_run(tmp_path, uninterrupted)


def start_frozen(
    server: FaultyServer, out: Path, log: Path
) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A `--workers 2` run started and held where the script freezes it (FROZEN_CALLS answered,
    the rest stalled): the parent and its workers' pids."""
    parent = start_parent(solve_argv(server, out, 2), log)
    frozen = wait_until(lambda: server.requests >= FROZEN_CALLS or parent.poll() is not None, 120)
    assert frozen and parent.poll() is None, log.read_text()
    return parent, worker_processes(parent.pid)


def test_a_run_killed_as_a_whole_resumes_into_the_same_records_and_report(
    tmp_path: Path, uninterrupted: Path
) -> None:
    """SIGKILL of the parent and its workers with questions recorded and others in flight
    (one at least after a finished step), then the same command: nothing lost or recorded
    twice, a question in flight went on from its checkpoint (on whichever worker took it), and
    the report is the uninterrupted run's."""
    out, log = tmp_path / "run", tmp_path / "parent.log"
    with faulty_server(FREEZES) as server:
        parent, workers = start_frozen(server, out, log)
        recorded = recorded_keys(out)
        asked = {session.split("/", 1)[1] for session in server.sessions if session}
        assert len(workers) == 2 and 0 < len(recorded) < QUESTIONS
        assert len(asked - set(recorded)) == IN_FLIGHT
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        assert wait_until(lambda: all(gone(worker) for worker in workers), 30)

    with faulty_server([FAST]) as server:
        assert mur.cli.main(solve_argv(server, out, 2)) == 0
        calls = server.requests
    assert_same_run(out, uninterrupted)
    resumed = [record for record in load_records(out) if record.get("resumed")]
    assert resumed, "no question in flight went on from its checkpoint"
    assert calls < 3 * (QUESTIONS - len(recorded))  # their finished steps were not asked again


def test_a_worker_killed_alone_is_named_and_a_rerun_finishes_its_questions(
    tmp_path: Path, uninterrupted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The other worker finishes every other question; the parent exits 1 with one line naming
    the dead worker and what it left; a rerun records the rest."""
    victim: list[psutil.Process] = []
    with faulty_server([SLOW]) as server:

        def kill_a_busy_worker() -> None:
            # A worker that asks the server holds its 2 questions (its share) while the queue
            # is not empty: at most 6 recorded, of 12, with 4 in flight.
            def busy() -> bool:
                talking = [w for w in worker_processes(os.getpid()) if talks_to(w, server)]
                victim[:] = talking[:1]
                return bool(talking) and 1 <= len(recorded_keys(tmp_path)) <= 6

            if wait_until(busy, 120):
                victim[0].kill()

        killer = threading.Thread(target=kill_a_busy_worker, daemon=True)
        killer.start()
        status = mur.cli.main(solve_argv(server, tmp_path, 2))
        killer.join()
    lines = capsys.readouterr().err.splitlines()
    assert status == 1 and victim
    said = re.fullmatch(
        rf"worker [12] of 2 \(pid {victim[0].pid}\) was killed by SIGKILL with 2 runs in flight, "
        rf"left for a rerun; (\d+) runs finished this time and are saved in "
        rf"{re.escape(str(tmp_path))}, (\d+) left: rerun the same command to finish the rest",
        lines[-1],
    )
    assert said, lines[-3:]
    finished, left = map(int, said.groups())
    assert finished + left == QUESTIONS and left >= 2  # (a record written as it died counts)
    assert sum("was killed by" in line for line in lines) == 1
    assert not (tmp_path / "report.md").exists()  # written once, by the run that finishes

    recorded = len(recorded_keys(tmp_path))
    with faulty_server([FAST]) as server:  # one process: a rerun in workers is the test above's
        assert mur.cli.main(solve_argv(server, tmp_path, 1)) == 0
    assert f"{recorded} already in" in capsys.readouterr().err
    assert_same_run(tmp_path, uninterrupted)


def test_sigint_to_the_group_then_sigterm_stop_the_workers_as_one_process_stops(
    tmp_path: Path,
) -> None:
    """A Ctrl-C reaches every process of the group: the workers leave it to the parent, which
    starts no new question; a second signal (SIGTERM to the parent) stops those in flight.
    Exit 130 with one process's lines, and no worker left behind."""
    out, log = tmp_path / "run", tmp_path / "parent.log"
    with faulty_server(FREEZES) as server:
        parent, workers = start_frozen(server, out, log)
        recorded = len(recorded_keys(out))
        os.killpg(parent.pid, signal.SIGINT)
        first = f"SIGINT: starting no new questions; the {IN_FLIGHT} in flight finish and are saved"
        assert wait_until(lambda: first in log.read_text(), 60), log.read_text()
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 130, log.read_text()
    said = log.read_text()
    assert f"SIGTERM again: stopping the {IN_FLIGHT} questions in flight now" in said
    assert (
        f"stopped (SIGINT): {recorded} runs finished this time and are saved in {out}, "
        f"{QUESTIONS - recorded} left; rerun the same command" in said
    )
    assert "worker" not in said.replace("2 worker processes", "") and "Traceback" not in said
    assert len(workers) == 2 and all(gone(worker) for worker in workers)
    assert len(recorded_keys(out)) == recorded


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--dataset", "math500", "--workers", "0"], "argument --workers: must be > 0, got 0"),
        (["--workers", "2"], "--workers runs an evaluation in processes: add --dataset"),
    ],
)
def test_bad_workers_flags_exit_2_with_one_line(
    flags: list[str],
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        solve_command, "connect", lambda *a, **k: pytest.fail("no server for bad input")
    )
    try:
        status = mur.cli.main(["solve", "--strategy", "critic", *flags])
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    err = capsys.readouterr().err.splitlines()
    assert status == 2 and len(err) == 1, err
    assert err[0] == f"mur solve: error: {says}; see --help"
