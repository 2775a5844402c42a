"""Kill the real vLLM server in the middle of a dataset run: the rerun loses and duplicates
nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mur.evals.harness.records import records_so_far
from mur.servers.processes.launcher import status, up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS, GATES = 4, ["mur", "never"]


def benchmark(base_url: str, out: Path, data: Path) -> subprocess.Popen:
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
            str(QUESTIONS),
            "--gate",
            ",".join(GATES),
            "--concurrency",
            "2",
            "--max-steps",
            "3",
            "--max-step-tokens",
            "48",
            "--judge-max-tokens",
            "32",
            "--base-url",
            base_url,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(3600)  # a benchmark, a restart of the server (up to 900 s), the rerun
def test_killing_the_server_mid_run_loses_and_duplicates_nothing(
    cpu_server, tmp_path, test_data
) -> None:
    out = tmp_path / "run"
    run = benchmark(cpu_server.base_url, out, test_data)
    deadline = time.monotonic() + 600
    while len(records_so_far(out)) < 2:
        assert run.poll() is None, run.stderr.read()
        assert time.monotonic() < deadline, "no records after 10 minutes"
        time.sleep(0.5)
    pid = cpu_server.pid or next(s.pid for s in status() if s.profile == cpu_server.profile)
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 1
    assert "stopped answering" in stderr and "rerun the same command" in stderr
    assert "Traceback" not in stderr
    partial = len(records_so_far(out))
    assert 2 <= partial < QUESTIONS * len(GATES)

    eager = os.environ.get("MUR_TEST_COMPILED", "") != "1"
    restarted = up("cpu-tiny", eager=eager, timeout=900, progress=False)
    cpu_server.pid = restarted.pid  # later tests and the session teardown use the new one
    rerun = benchmark(restarted.base_url, out, test_data)
    _, stderr = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, stderr
    assert f"{partial} already in" in stderr
    keys = [record["key"] for record in records_so_far(out)]
    assert len(keys) == len(set(keys)) == QUESTIONS * len(GATES)
    assert (out / "report.md").exists()
