"""`langgraph dev` serves the graphs of langgraph.json; runs go through langgraph_sdk."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from langgraph_sdk import get_client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def langgraph_api(cpu_server, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("langgraph") / "dev.log"
    env = {
        **os.environ,
        "MUR_BASE_URL": cpu_server.base_url,
        "MUR_MODEL": cpu_server.model,
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_TRACING": "false",
    }
    cli = Path(sys.executable).with_name("langgraph")
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(cli), "dev", "--no-browser", "--no-reload", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"langgraph dev exited:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/ok", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail(f"langgraph dev did not start:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_studio_serves_every_strategy_and_runs_one(langgraph_api) -> None:
    client = get_client(url=langgraph_api)
    graphs = {a["graph_id"] for a in await client.assistants.search()}
    assert graphs == {"mur_critic", "mur_best_of_n", "mur_foresight", "mur_thinking"}
    thread = await client.threads.create()
    result = await client.runs.wait(
        thread["thread_id"],
        "mur_critic",
        input={"question": "What is 3 + 4?"},
        context={"gate": "always", "max_steps": 2, "max_step_tokens": 48, "judge_max_tokens": 32},
    )
    assert set(result) == {
        "question",
        "answer",
        "finish_reason",
        "steps",
        "usage",
        "fallback",
        "config",
    }
    assert result["config"]["gate"] == "always"
    assert result["steps"] and all(step["scaled"] for step in result["steps"])
    assert result["usage"]["backbone_tokens"] > 0
