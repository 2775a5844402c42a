"""Drain on deploy, for real: `mur endpoint` processes over the scripted model server, sent
SIGTERM mid-run. The first signal stops new runs (503 with Retry-After, /health 503), lets the
run in flight finish within the grace period or stops it at its last checkpoint, then exits 0;
a retry with the same key resumes the stopped run on another process; a second signal exits
at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from faulty_server import MODEL, faulty_server
from mur.benchmarks.chaos import runs_in_flight
from postgres import free_port
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def health(url: str) -> httpx.Response | None:
    try:
        return httpx.get(f"{url}/health", timeout=2)
    except httpx.HTTPError:
        return None


@contextmanager
def endpoint(backbone_url: str, checkpoints: Path, *flags: str) -> Iterator[tuple[str, Any]]:
    """A `mur endpoint` process on a free port over `backbone_url`, checkpointed in the
    SQLite file `checkpoints`: (its root URL, the process)."""
    port = free_port()
    command = [sys.executable, "-m", "mur", "endpoint", "--port", str(port)]
    command += ["--base-url", backbone_url, "--model", MODEL, "--checkpointer", str(checkpoints)]
    process = subprocess.Popen(
        [*command, *flags],
        cwd=ROOT,
        env={**os.environ, "MUR_CHECKPOINTER": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: health(url) is not None, 60), "mur endpoint did not start"
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def ask(url: str, replies: list[httpx.Response], key: str | None = None) -> threading.Thread:
    """Send the question in a thread of its own; its reply lands in `replies`."""
    headers = {"Idempotency-Key": key} if key else {}
    body = {"model": "mur-critic-never", "messages": QUESTION, "mur": {"max_steps": 4}}

    def send() -> None:
        replies.append(
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)
        )

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_sigterm_refuses_new_runs_and_lets_the_run_in_flight_finish(tmp_path: Path) -> None:
    with (
        faulty_server(["slowstep:1.5", "slowstep:1.5", "ok"]) as backbone,
        endpoint(backbone.base_url, tmp_path / "runs.sqlite", "--drain-seconds", "30") as (
            url,
            process,
        ),
    ):
        replies: list[httpx.Response] = []
        first = ask(url, replies, key="first")
        assert wait_until(lambda: runs_in_flight(url) == 1, 30)
        process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: (health(url) or httpx.Response(0)).status_code == 503, 10)
        refused = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "mur-critic-never", "messages": QUESTION},
            timeout=10,
        )
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "draining"
        first.join(60)
        assert replies[0].status_code == 200, replies[0].text
        assert "4" in replies[0].json()["choices"][0]["message"]["content"]
        assert process.wait(30) == 0
        output = process.stdout.read()
    assert "draining" in output and "Traceback" not in output


def test_a_run_cut_by_the_drain_resumes_on_another_process(tmp_path: Path) -> None:
    checkpoints = tmp_path / "runs.sqlite"
    with faulty_server(["step", "slowstep:30", "ok"]) as backbone:
        with endpoint(backbone.base_url, checkpoints, "--drain-seconds", "1") as (url, process):
            replies: list[httpx.Response] = []
            thread = ask(url, replies, key="long")
            # The first step is kept (checkpointed); the second stalls in the model call.
            assert wait_until(lambda: backbone.requests >= 2, 30)
            process.send_signal(signal.SIGTERM)
            thread.join(30)
            cut = replies[0]
            assert cut.status_code == 503 and cut.headers["Retry-After"] == "1", cut.text
            assert "same Idempotency-Key" in cut.json()["error"]["message"]
            assert process.wait(30) == 0
        backbone.script = ["ok"]  # the retry's model calls answer at once
        asked_before = backbone.requests
        with endpoint(backbone.base_url, checkpoints) as (url, _):
            replies = []
            ask(url, replies, key="long").join(60)
        resumed = replies[0]
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["mur"]["run"]["outcome"] == "resumed"
        # Only the step in flight was asked again: the first step came from the checkpoint.
        assert backbone.requests - asked_before == 1


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    with (
        faulty_server(["slowstep:30"]) as backbone,
        endpoint(backbone.base_url, tmp_path / "runs.sqlite", "--drain-seconds", "60") as (
            url,
            process,
        ),
    ):
        replies: list[httpx.Response] = []
        ask(url, replies, key="stuck")
        assert wait_until(lambda: runs_in_flight(url) == 1, 30)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 1
        # At once: before the step in flight (30 s at the backbone) came back, which a drain
        # (60 s) would have waited for.
        assert backbone.answered == 0
