"""`langgraph dev` serves the graph of langgraph.json; runs go through langgraph_sdk."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from langgraph_sdk import get_client

from mur.graphs.refine import STRATEGIES
from mur.servers.processes.replicas import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


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


async def test_studio_draws_every_strategy_in_the_one_graph_and_runs_one(langgraph_api) -> None:
    client = get_client(url=langgraph_api)
    assistants = await client.assistants.search()
    assert {a["graph_id"] for a in assistants} == {"mur"}
    drawing = await client.assistants.get_graph(assistants[0]["assistant_id"], xray=True)
    drawn = {node["id"] for node in drawing["nodes"]}
    assert {"plan_traces", "vote"} <= drawn  # a question's traces, and their vote
    loop = {"draft_step", "score_uncertainty", "gamma_gate", "commit_step"}
    assert {f"trace:{name}" for name in loop} <= drawn  # each trace is the loop
    for strategy in STRATEGIES:
        assert any(node.startswith(f"trace:{strategy}:") for node in drawn), strategy
    thread = await client.threads.create()
    result = await client.runs.wait(
        thread["thread_id"],
        "mur",
        input={"question": "What is 3 + 4?"},
        context={
            "strategy": "critic",
            "gate": "always",
            "max_steps": 2,
            "max_step_tokens": 48,
            "judge_max_tokens": 32,
        },
    )
    assert set(result) == {
        "question",
        "answer",
        "finish_reason",
        "steps",
        "usage",
        "fallback",
        "config",
        "traces",
    }
    assert result["config"]["gate"] == "always" and result["config"]["strategy"] == "critic"
    assert result["steps"] and all(step["scaled"] for step in result["steps"])
    assert result["usage"]["backbone_tokens"] > 0
