"""A long single run resumes from its SQLite checkpoint; Ctrl-C on a benchmark says how to go on."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from fakes import FakeLogprobChat, Scripted
from faulty_server import MODEL, faulty_server
from mur.graphs import Context, build_graph
from mur.graphs.solve import solve
from postgres import PASSWORD

ROOT = Path(__file__).resolve().parents[2]


class Crash(Exception):
    """The process dying mid-run."""


def script(crash_at: int | None):
    def respond(messages, kwargs):
        index = int(re.findall(r"Step(\d+):$", str(messages[-1].content))[-1])
        if index == crash_at:
            raise Crash(f"died drafting step {index}")
        if index == 4:
            return Scripted(" so the answer is 9.", [-0.3] * 4, stop_reason=None)
        return Scripted(f" step {index}", [-0.3] * 4)

    return respond


async def test_a_checkpointed_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    db = str(tmp_path / "run.sqlite")
    config = {"configurable": {"thread_id": "t1"}}
    context = Context(gate="never")
    crashing = FakeLogprobChat(responder=script(crash_at=3))
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        graph = build_graph(backbone=crashing, checkpointer=saver)
        with pytest.raises(Crash):
            await solve(graph, "q", context=context, config=config)
    healthy = FakeLogprobChat(responder=script(crash_at=None))
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        graph = build_graph(backbone=healthy, checkpointer=saver)
        resumed: list[bool] = []
        solution = await solve(
            graph, "q", context=context, config=config, on_resume=lambda: resumed.append(True)
        )
    result = solution.output
    assert solution.resumed and resumed == [True]
    assert [s["text"] for s in result["steps"]] == [
        "step 1",
        "step 2",
        "step 3",
        "so the answer is 9.",
    ]
    # Only steps 3 and 4 were generated again: steps 1 and 2 came from the checkpoint.
    assert len(healthy.calls) == 2
    # The usage of the whole solution, both processes' steps included.
    assert result["usage"]["backbone_tokens"] == 16


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_on_a_benchmark_says_how_to_resume(tmp_path: Path, test_data: Path) -> None:
    with faulty_server(["delay:0.5"]) as server:
        proc = subprocess.Popen(
            [
                sys.executable,
                "run.py",
                "--strategy",
                "critic",
                "--gate",
                "never",
                "--dataset",
                "math500",
                "--data-dir",
                str(test_data),
                "--limit",
                "20",
                "--concurrency",
                "1",
                "--base-url",
                server.base_url,
                "--out",
                str(tmp_path),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # As from a terminal: a shell's background job inherits SIGINT ignored, and a
            # Python started that way never raises KeyboardInterrupt.
            preexec_fn=_default_sigint,
        )
        records = tmp_path / "records.jsonl"
        deadline = time.monotonic() + 60
        while not (records.exists() and records.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "rerun the same command" in stderr and "Traceback" not in stderr
    lines = records.read_text().splitlines()
    assert 2 <= len(lines) < 20 and all(line.endswith("}") for line in lines)


# ---------------------------------------------- a second stop signal, and the run that resumes

# Three steps answered, then the fourth draft never answers: the question is in flight, with
# three finished steps checkpointed, when the signals come.
STALLS_AT_STEP_4 = ["step", "step", "step", "stall"]
FINISHES_AT_STEP_4 = ["step", "step", "step", "ok"]


def benchmark(base_url: str, out: Path, test_data: Path) -> list[str]:
    return [
        sys.executable, "run.py", "--strategy", "critic", "--gate", "never",
        "--dataset", "math500", "--data-dir", str(test_data), "--limit", "1",
        "--max-steps", "6", "--base-url", base_url, "--out", str(out),
    ]  # fmt: skip


def records_of(folder: Path) -> list[dict]:
    """records.jsonl as a user reads it."""
    path = folder / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class StderrLines:
    """A process's stderr, read as it comes (a thread), to wait for a line."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(proc.stderr,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            self.seen.append(self.lines.get(timeout=max(deadline - time.monotonic(), 0.01)))

    def rest(self) -> str:
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)


def test_a_second_stop_signal_stops_the_question_and_the_rerun_resumes_it(
    tmp_path: Path, test_data: Path
) -> None:
    """README: a second Ctrl-C or SIGTERM stops the questions in flight too, "and the next run
    resumes each from its checkpoint": the rerun records it as resumed, with the same steps
    and usage as a run never stopped, asking the server only for what was not finished. Here
    a Ctrl-C, then a SIGTERM (either kind counts as the first or the second)."""
    with faulty_server(FINISHES_AT_STEP_4) as server:
        fresh = subprocess.run(
            benchmark(server.base_url, tmp_path / "fresh", test_data),
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    [expected] = records_of(tmp_path / "fresh")
    fresh_calls = server.requests
    assert expected["steps_total"] == 4 and "resumed" not in expected

    out = tmp_path / "stopped"
    with faulty_server(STALLS_AT_STEP_4) as server:
        proc = subprocess.Popen(
            benchmark(server.base_url, out, test_data),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_default_sigint,  # as from a terminal (see the Ctrl-C test above)
        )  # fmt: skip
        stderr = StderrLines(proc)
        deadline = time.monotonic() + 60
        while server.requests < len(STALLS_AT_STEP_4):
            assert proc.poll() is None and time.monotonic() < deadline, stderr.rest()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stderr.wait_for("SIGINT: starting no new questions; the 1 in flight finish and are saved")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    said = stderr.rest()
    assert proc.returncode == 130, said
    assert "SIGTERM again: stopping the 1 questions in flight now" in said
    assert "stopped (SIGINT)" in said
    assert "0 runs finished this time" in said and "rerun the same command" in said
    assert "Traceback" not in said
    assert records_of(out) == [] and (out / "checkpoints.sqlite").exists()

    with faulty_server(["ok"]) as server:
        rerun = subprocess.run(
            benchmark(server.base_url, out, test_data),
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    [record] = records_of(out)
    assert record["resumed"] is True
    assert 0 < server.requests < fresh_calls  # only the step that never came back
    assert [s["text"] for s in record["trace"]["steps"]] == [
        s["text"] for s in expected["trace"]["steps"]
    ]
    assert record["usage"] == expected["usage"] and record["answer"] == expected["answer"]


# ------------------------------------------------ --checkpoint through the endpoint's factory


def solve_command(base_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "run.py", "--strategy", "critic", "--gate", "never"]
    command += ["--max-steps", "6", "--base-url", base_url, "--model", MODEL, *flags]
    return subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_checkpointed_in_postgres_resumes_by_thread_id(postgres) -> None:
    """`--checkpoint postgresql://...` takes the same factory as the endpoint: a run whose
    backbone fails at step 3 resumes there from PostgreSQL, steps 1-2 not asked again."""
    url = postgres.create_database("solve_resume")
    flags = ("--checkpoint", url, "--thread-id", "t-pg")
    with faulty_server(["step", "step", "500"]) as failing:
        failed = solve_command(failing.base_url, *flags)
    assert failed.returncode == 1, failed.stderr
    assert PASSWORD not in failed.stdout + failed.stderr
    with faulty_server(["step", "ok"]) as healthy:
        resumed = solve_command(healthy.base_url, *flags, "--json")
        asked = healthy.requests
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["answer"] == "4"
    assert asked == 2  # step 3 and step 4 (the answer); steps 1 and 2 came from the checkpoint


def test_a_bad_checkpoint_target_is_one_line_without_its_password(tmp_path: Path) -> None:
    unusable = solve_command("http://127.0.0.1:9/v1", "--checkpoint", "mysql://u:hunter2@h/db")
    assert unusable.returncode == 2 and len(unusable.stderr.strip().splitlines()) == 1
    assert "--checkpoint" in unusable.stderr and "hunter2" not in unusable.stderr
