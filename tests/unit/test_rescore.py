"""experiments.rescore: recorded steps sent back as prompt tokens, and what their scores change."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from mur.cli.experiment.publish import float_list, publish
from mur.cli.experiment.rescore import main
from mur.evals.harness.records import RecordStore
from mur.evals.questions import load_dataset
from mur.experiments.rescore import Scorer, agreement, recorded_traces, report
from mur.nodes.gates import replay_decisions
from mur.servers.clients.errors import ServerError

SETTINGS = {"step_format": "paragraph", "alpha": 0.9, "max_step_tokens": 8}


def record(key: str, gate: str, steps: list[tuple[str, float, int, bool]]) -> dict[str, Any]:
    """A record of the first test question with steps (text, uncertainty, tokens, scaled)."""
    return {
        "key": key,
        "dataset": "math500",
        "problem_id": "tests/arithmetic/1.json",
        "gate": gate,
        "trace": {
            "steps": [
                {"index": i, "text": t, "uncertainty": m, "num_tokens": n, "scaled": s}
                for i, (t, m, n, s) in enumerate(steps, start=1)
            ]
        },
    }


def calm(text: str, uncertainty: float = 0.1) -> tuple[str, float, int, bool]:
    """An unscaled step of 2 tokens."""
    return (text, uncertainty, 2, False)


@pytest.fixture
def problems(test_data: Path):
    return {(p.dataset, p.id): p for p in load_dataset("math500", test_data)}


def test_traces_give_each_step_but_the_last_its_prompt_and_separator(problems) -> None:
    records = [
        record("a", "mur", [("x", 0.1, 2, False), ("y", 0.2, 2, False)]),  # another gate
        record("b", "never", [("First.", 0.1, 3, False), ("Cut", 0.3, 8, False), calm("72")]),
        record("c", "never", [("Only.", 0.1, 2, False)]),  # nothing to compare
        record("d", "never", [("p", 0.1, 2, False), ("q", 0.2, 2, True)]),  # scaled: not a draft
        record("e", "never", [("s", 0.1, 2, False), ("t", 0.2, 2, False)]),
    ]  # fmt: skip
    traces = list(recorded_traces(records, problems, SETTINGS, "never", limit=1))
    assert [t.key for t in traces] == ["b"]
    (trace,) = traces
    assert trace.uncertainties == (0.1, 0.3, 0.1)
    first, second = trace.steps
    assert [m["role"] for m in first.prefix] == ["user", "assistant"]  # MATH has no system
    assert "What is 7 + 5?" in first.prefix[0]["content"]
    assert first.prefix[-1]["content"] == "" and first.separator == "\n\n"
    assert second.prefix[-1]["content"] == "First.\n\n"
    assert second.separator == ""  # it ran into max_step_tokens: no separator was generated
    assert len(list(recorded_traces(records, problems, SETTINGS, "never", limit=5))) == 2


def test_a_question_missing_from_the_data_says_which_and_what_to_pass() -> None:
    records = [record("b", "never", [calm("a"), calm("b")])]
    with pytest.raises(ValueError, match=r"tests/arithmetic/1\.json .* --data-dir"):
        list(recorded_traces(records, {}, SETTINGS, "never", 1))


def fake_server(logprob: float, *, extra_token: bool = False) -> httpx.MockTransport:
    """vLLM's /tokenize and prompt_logprobs, one token per character of the assistant text."""

    def tokens(body: dict[str, Any]) -> list[int]:
        ids = [ord(c) for c in body["messages"][-1]["content"]]
        return [
            1,
            2,
            *ids,
            *([3] if extra_token and "\n\n" in body["messages"][-1]["content"] else []),
        ]

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["continue_final_message"] and not body["add_generation_prompt"]
        ids = tokens(body)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": ids, "count": len(ids)})
        assert request.url.path == "/v1/chat/completions" and body["prompt_logprobs"] == 0
        entries = [None] + [{str(i): {"logprob": logprob, "rank": 1}} for i in ids[1:]]
        return httpx.Response(200, json={"prompt_logprobs": entries})

    return httpx.MockTransport(handle)  # fmt: skip


async def test_the_scorer_averages_the_step_tokens_and_refuses_misaligned_ones(problems) -> None:
    steps = [("Ab.", 0.2, 5, False), ("Cd", 0.3, 3, False), ("e", 0.1, 2, False)]
    (trace,) = recorded_traces([record("b", "never", steps)], problems, SETTINGS, "never", 1)
    # "Ab." and "\n\n": 5 tokens here, as generated; "Cd\n\n" 4, but 3 were generated.
    async with httpx.AsyncClient(transport=fake_server(-0.25)) as client:
        assert await Scorer(client, "http://vllm:8000/v1", "m").uncertainties(trace) == [0.25, None]
    async with httpx.AsyncClient(transport=fake_server(-0.25, extra_token=True)) as client:
        assert await Scorer(client, "http://vllm:8000", "m").uncertainties(trace) == [None, None]


async def test_a_server_error_names_the_url_and_status() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(404, text="no such route"))
    async with httpx.AsyncClient(transport=transport) as client:
        scorer = Scorer(client, "http://vllm:8000/v1", "m")
        with pytest.raises(ServerError, match=r"http://vllm:8000/tokenize answered HTTP 404"):
            await scorer._post(f"{scorer.root}/tokenize", {})


def test_agreement_counts_the_decisions_a_rescored_step_changes(problems) -> None:
    steps = [calm("a"), calm("b"), calm("c", 0.05), calm("d")]
    (trace,) = recorded_traces([record("b", "never", steps)], problems, SETTINGS, "never", 1)
    # step 3 rescored far above the momentum: MUR now scales it; step 2 unaligned (None).
    rescored = [[0.1, None, 0.5]]
    result = agreement([trace], rescored, 0.9, [("mur 0.9", 0.9, False)])
    assert (result.steps, result.aligned) == (3, 2)
    assert result.mean_abs_diff == pytest.approx(0.225) and result.max_abs_diff == pytest.approx(
        0.45
    )
    before = replay_decisions("mur", [0.10, 0.10, 0.05, 0.1])[1:]
    after = replay_decisions("mur", [0.10, 0.10, 0.5, 0.1])[1:]
    differ = sum(x != y for x, y in zip(before, after, strict=True))
    assert differ >= 1 and result.flips["mur 0.9"] == (differ, 3, sum(before) / 3, sum(after) / 3)
    text = report(result, "results/x", "http://vllm:8000/v1", "m", 1)
    assert "2 (67%) tokenized as generated" in text and f"| mur 0.9 | 3 | {differ} (" in text
    with pytest.raises(ValueError, match="none of the 3 steps tokenized as generated"):
        agreement([trace], [[None, None, None]], 0.9, [("mur 0.9", 0.9, False)])
    same = agreement([trace], [[0.1, 0.1, 0.05]], 0.9, [("mur 0.9", 0.9, False)])
    assert same.mean_abs_diff == 0 and same.flips["mur 0.9"][0] == 0
    assert math.isclose(same.correlation, 1.0)


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing"), "--base-url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mur experiment rescore: ") and "settings.json" in err and "\n" not in err
    (tmp_path / "settings.json").write_text(json.dumps(SETTINGS))
    RecordStore(tmp_path).append(record("k", "mur", [("a", 0.1, 2, False)] * 2))
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path), "--base-url", "http://127.0.0.1:9"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "holds no never traces of two or more steps without a scaled step" in err


def test_publish_prints_and_writes_the_summary_with_its_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "summary.md"
    publish("# table\n", out, "mur experiment rescore", ["results/x", "--limit", "3"])
    assert capsys.readouterr().out == "# table\n\n"
    assert out.read_text() == "# table\n\nCommand: mur experiment rescore results/x --limit 3\n"
    assert float_list("0.8,0.9") == (0.8, 0.9)
    with pytest.raises(argparse.ArgumentTypeError, match="not a list of numbers"):
        float_list("0.8,x")
