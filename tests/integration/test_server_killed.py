"""Kill the real vLLM server in the middle of a dataset run: a server given by URL stops the
run, and the rerun loses and duplicates nothing; the embedded server is started again by the
run itself, which finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mur.evals.harness.records import records_so_far
from mur.servers.processes.launcher import status

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS, GATES = 4, ["mur", "never"]
# The embedded run has twice the questions, so that it is still under way when the run given
# --base-url has its two records, however the sampled steps' lengths fall (with the same 4, CI
# once saw it end first).
EMBEDDED_QUESTIONS = 2 * QUESTIONS


def benchmark(
    base_url: str | None, out: Path, data: Path, questions: int = QUESTIONS
) -> subprocess.Popen:
    """The benchmark on the server at `base_url`, or (None) on the embedded cpu-tiny server."""
    server = ["--base-url", base_url] if base_url else ["--profile", "cpu-tiny", "--eager"]
    return subprocess.Popen(
        [
            sys.executable,
            "run.py",
            "--strategy",
            "critic",
            "--dataset",
            "math500",
            "--data-dir",
            str(data),
            "--limit",
            str(questions),
            "--gate",
            ",".join(GATES),
            "--concurrency",
            "2",
            "--max-steps",
            "3",
            "--max-step-tokens",
            "24",
            "--judge-max-tokens",
            "32",
            *server,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(3600)  # two benchmarks, a restart of the server (up to 900 s), a rerun
def test_killing_the_server_mid_run_loses_and_duplicates_nothing(
    cpu_server, tmp_path, test_data
) -> None:
    """Two runs on one server, killed after two records: the run given --base-url stops
    ("stopped answering"); the run on the embedded server (no --base-url: the session's
    cpu-tiny) starts it again through its own clients, the graph's retry asks again, and it
    ends with every record and exit 0. Then a rerun of the first loses and duplicates
    nothing."""
    out, healing = tmp_path / "run", tmp_path / "embedded"
    run = benchmark(cpu_server.base_url, out, test_data)
    embedded = benchmark(None, healing, test_data, EMBEDDED_QUESTIONS)
    deadline = time.monotonic() + 600
    while len(records_so_far(out)) < 2 or not records_so_far(healing):
        assert run.poll() is None, run.stderr.read()
        assert embedded.poll() is None, embedded.stderr.read()
        assert time.monotonic() < deadline, "no records after 10 minutes"
        time.sleep(0.5)
    pid = next(s.pid for s in status() if s.profile == cpu_server.profile)
    assert pid is not None
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert len(records_so_far(healing)) < EMBEDDED_QUESTIONS * len(GATES), "it had ended"
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 1
    assert "stopped answering" in stderr and "rerun the same command" in stderr
    assert "Traceback" not in stderr
    partial = len(records_so_far(out))
    assert 2 <= partial < QUESTIONS * len(GATES)

    _, stderr = embedded.communicate(timeout=1200)
    assert embedded.returncode == 0, stderr[-3000:]
    assert "the cpu-tiny server at" in stderr and "had died: started it again" in stderr
    healed = records_so_far(healing)
    assert len({r["key"] for r in healed}) == len(healed) == EMBEDDED_QUESTIONS * len(GATES)
    restarted = next(s for s in status() if s.profile == cpu_server.profile)
    assert restarted.healthy and restarted.pid != pid
    cpu_server.pid = restarted.pid  # later tests and the session teardown use the new one

    rerun = benchmark(restarted.base_url, out, test_data)
    _, stderr = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, stderr
    assert f"{partial} already in" in stderr
    keys = [record["key"] for record in records_so_far(out)]
    assert len(keys) == len(set(keys)) == QUESTIONS * len(GATES)
    assert (out / "report.md").exists()
