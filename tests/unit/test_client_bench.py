"""`mur bench client`: each arm in a process of its own against the instant fake vLLM server,
the graph's own count held against the server's, and the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mur.benchmarks import client_cost
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
    assert client_cost.main([*argv, "--out", str(out)]) == 0
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
    assert all(entry["client_cpu_s"] > 0 and entry["server_cpu_s"] > 0 for entry in entries)
    printed = capsys.readouterr().out
    assert "| floor top0 | after" in printed and "1.0x" in printed
    assert client_cost.main(["--table", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == printed.split("\n\n", 1)[1].strip()


def test_bad_arms_and_a_missing_table_are_one_line() -> None:
    with pytest.raises(ValueError, match="unknown arm 'nope': choose one of floor top0, sdk top0"):
        client_cost.chosen_arms("floor top0,nope")
    assert client_cost.main(["--table"]) == 2
