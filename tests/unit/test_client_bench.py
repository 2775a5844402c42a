"""`mur bench client`: each arm in a process of its own against the instant fake vLLM server,
the graph's own count held against the server's, and the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mur.benchmarks import client_cost
from mur.cli.bench.client_cost import main
from mur.testing.fake_vllm import STEP_TOKENS

# A critic/mur question on the fake: eight steps, the third and sixth scaled: judged wrong (a
# 10-token verdict), then revised (a revision has its draft's length).
REQUESTS_PER_QUESTION = 8 + 2 * 2
TOKENS_PER_QUESTION = sum(STEP_TOKENS) + STEP_TOKENS[2] + STEP_TOKENS[5] + 2 * 10


def test_each_layer_is_measured_on_the_same_questions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "client.json"
    arms = "floor top0,graph top0,cli top0,endpoint keyed top0"
    argv = ["--questions", "3", "--concurrency", "2", "--arms", arms]
    assert main([*argv, "--out", str(out)]) == 0
    entries = json.loads(out.read_text())["entries"]
    assert [entry["arm"] for entry in entries] == arms.split(",")
    floor, graph, cli, endpoint = entries
    for entry in (floor, graph, endpoint):  # the timed questions exactly, not the warm-up
        assert entry["requests"] == 3 * REQUESTS_PER_QUESTION
        assert entry["tokens"] == 3 * TOKENS_PER_QUESTION
    for entry in (graph, endpoint):  # what the graph (the endpoint's reply) counted
        assert (entry["counted_tokens"], entry["counted_requests"]) == (
            entry["tokens"],
            entry["requests"],
        )
    assert 0 < cli["requests"] <= 5 * REQUESTS_PER_QUESTION  # sampled while it ran
    # The CPU and wall times are measured for each arm; what they come to is this machine's
    # (3 questions of the fake server's CPU round to 0.0 s on a fast one): the table's tests
    # below hold the arithmetic on given figures.
    for entry in entries:
        assert {"client_cpu_s", "server_cpu_s", "wall_s"} <= set(entry), entry
    printed = capsys.readouterr().out
    rows = [line.split(" | ")[:2] for line in printed.splitlines() if line.startswith("| ")]
    assert [arm for arm, _ in rows[1:]] == [f"| {arm}" for arm in arms.split(",")]
    assert all(checkout.startswith("after ") for _, checkout in rows[1:])
    assert main(["--table", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == printed.split("\n\n", 1)[1].strip()


def entry(arm: str, layer: str, client_cpu_s: float, server_cpu_s: float) -> dict:
    """One arm's figures as `mur bench client` keeps them: 1,000 tokens in 40 requests, 2 s."""
    return {
        "arm": arm,
        "checkout": "after abc123",
        "layer": layer,
        "top_logprobs": 0,
        "client_cpu_s": client_cpu_s,
        "server_cpu_s": server_cpu_s,
        "wall_s": 2.0,
        "requests": 40,
        "tokens": 1000,
    }


def test_the_table_gives_each_arm_its_cost_per_token_and_the_floors_multiple() -> None:
    text = client_cost.table(
        [entry("floor top0", "floor", 0.5, 0.25), entry("graph top0", "graph", 1.5, 0.25)]
    )
    assert "| floor top0 | after abc123 | 500.0 | 12.50 | 2,000 | 500 | 250.0 | 1.0x |" in text
    assert "| graph top0 | after abc123 | 1,500.0 | 37.50 | 666 | 500 | 250.0 | 3.0x |" in text


def test_a_cpu_time_under_the_clocks_tick_is_no_figure() -> None:
    """On a fast machine a short arm's CPU rounds to 0.0 s: its cells are '-', never a
    division by zero or a rate of infinity."""
    text = client_cost.table(
        [entry("floor top0", "floor", 0.0, 0.0), entry("graph top0", "graph", 1.5, 0.0)]
    )
    assert "| floor top0 | after abc123 | - | - | - | 500 | - | - |" in text
    assert "| graph top0 | after abc123 | 1,500.0 | 37.50 | 666 | 500 | - | - |" in text


def test_bad_arms_and_a_missing_table_are_one_line() -> None:
    with pytest.raises(ValueError, match="unknown arm 'nope': choose one of floor top0, sdk top0"):
        client_cost.chosen_arms("floor top0,nope")
    assert main(["--table"]) == 2
