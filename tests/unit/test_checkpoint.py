"""A long single run resumes from its SQLite checkpoint; Ctrl-C on a benchmark says how to go on."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from fakes import FakeLogprobChat, Scripted
from faulty_server import faulty_server
from graphs import Context, build_graph
from graphs.solve import solve

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
