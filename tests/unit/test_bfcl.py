"""The BFCL runner (experiments.bfcl) and `mur experiment bfcl`, without a model server of size:
a scripted agent model replays a real BFCL case's ground truth (BFCL's own checker finds it
valid) or a wrong call (invalid); the written-calls reader takes the JSON calls Qwen2.5-Coder
writes; the command runs cases against the instant vLLM-shaped server, records each once
and resumes."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from agent_fakes import PROMPT_TOKENS, Said, ScriptedAgentModel, calls, says

from asgi_server import running
from mur import MURMiddleware
from mur.cli.experiment import bfcl as command
from mur.evals.harness.records import load_records
from mur.experiments import bfcl
from mur.testing.fake_vllm import FakeVLLM

CASE = "multi_turn_base_0"


def ground_truth_call(text: str, case: bfcl.Case | None = None) -> tuple[str, dict[str, Any]]:
    """`mv(source='a',destination='b')` -> ("mv", {"source": "a", "destination": "b"}); a
    positional argument (`sort('a')`) takes its name from the case's function document."""
    call = ast.parse(text, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
    args = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    if call.args:
        assert case is not None, text
        [doc] = [f for f in case.entry["function"] if f["name"] == call.func.id]
        names = list(doc["parameters"]["properties"])
        args |= {names[i]: ast.literal_eval(value) for i, value in enumerate(call.args)}
    return call.func.id, args


def replaying(case: bfcl.Case, wrong_first_call: bool = False) -> list[Said]:
    """A script that makes the ground truth's calls one reply at a time, then says it is done,
    in each turn; the uncertainties rise with the call, so a gate has something to flag."""
    script: list[Said] = []
    for turn in case.ground_truth:
        for text in turn:
            name, args = ground_truth_call(text, case)
            if wrong_first_call and not script:
                args = {key: "nowhere" for key in args}
            script.append(calls(name, args, 0.1 + 0.2 * len(script)))
        script.append(says("Done.", 0.05))
    return script


def gated(**settings: Any) -> MURMiddleware:
    """The middleware as the command sets it: one momentum over the case's turns."""
    return MURMiddleware(momentum_scope="thread", **settings)


@pytest.fixture(scope="module")
def case() -> bfcl.Case:
    [loaded] = bfcl.load_cases("multi_turn_base", 0, 1)
    assert loaded.id == CASE and len(loaded.ground_truth) == len(loaded.entry["question"])
    return loaded


async def test_the_ground_truth_replayed_by_an_agent_is_valid_and_its_tokens_counted(
    case: bfcl.Case,
) -> None:
    script = replaying(case)
    model = ScriptedAgentModel(script=list(script))
    run = await bfcl.run_case(case, model, gated(gate="never", samples=2))
    assert run.finish_reason == "answer"
    assert [[ground_truth_call(text, case) for [text] in turn] for turn in run.turns] == [
        [ground_truth_call(text, case) for text in turn] for turn in case.ground_truth
    ]  # one call a reply, as scripted
    assert bfcl.check(case, run) == (True, "")
    usage = bfcl.usage_of(run.calls)
    assert usage["backbone_tokens"] == sum(len(said.logprobs) for said in script)
    assert usage["backbone_prompt_tokens"] == PROMPT_TOKENS * len(script)
    assert (usage["external_tokens"], usage["llm_calls"]) == (0, len(script))
    assert [call["call"] for call in run.calls] == list(range(1, len(script) + 1))  # one thread


async def test_a_wrong_call_fails_the_case_and_flagged_calls_go_to_the_stronger_model(
    case: bfcl.Case,
) -> None:
    script = replaying(case, wrong_first_call=True)
    stronger = ScriptedAgentModel(script=replaying(case), model_name="stronger")
    agent_model = ScriptedAgentModel(script=list(script))
    middleware = gated(gate="always", escalate_to=stronger)
    run = await bfcl.run_case(case, agent_model, middleware)
    # every call rewritten by the stronger model, whose calls (the ground truth) are kept
    assert {record["action"] for record in run.calls} == {"escalated"}
    assert bfcl.check(case, run) == (True, "")
    usage = bfcl.usage_of(run.calls)
    assert usage["external_tokens"] == sum(len(s.logprobs) for s in replaying(case))

    alone = await bfcl.run_case(
        case, ScriptedAgentModel(script=list(script)), gated(gate="never", samples=2)
    )
    valid, error = bfcl.check(case, alone)
    assert not valid and error.startswith("multi_turn:")


async def test_a_record_carries_the_verdict_the_calls_and_each_models_tokens(
    case: bfcl.Case,
) -> None:
    run = await bfcl.run_case(
        case, ScriptedAgentModel(script=replaying(case)), gated(gate="never", samples=2)
    )
    key = bfcl.JobKey(bfcl.DATASET, case.id, "escalate", "never", None, 0)
    record = bfcl.case_record(key, case, run, 1.5, {"gate": "never"})
    assert record["key"] == f"bfcl/{CASE}/escalate/never/-/0"
    assert record["correct"] is True and record["finish_reason"] == "answer"
    assert json.loads(record["answer"] or "") == run.turns
    assert json.loads(record["gold"]) == case.ground_truth
    assert record["steps_total"] == len(run.calls) and record["steps_scaled"] == 0


def test_calls_written_as_json_are_read_for_the_tools_named() -> None:
    text = (
        'I will move it.\n```json\n{"name": "mv", "arguments": {"source": "a", "destination": '
        '"b"}}\n```\nthen [{"name": "ls", "arguments": "{\\"a\\": true}"}, {"name": "rm", '
        '"arguments": {}}] and {"name": "mv", "arguments": [1]}'
    )
    found = bfcl.written_calls(text, {"mv", "ls"})
    assert [(call["name"], call["args"]) for call in found] == [
        ("mv", {"source": "a", "destination": "b"}),
        ("ls", {"a": True}),
    ]  # rm is not a tool here; arguments that are not an object are no call
    assert all(call["id"] and call["type"] == "tool_call" for call in found)
    assert bfcl.written_calls("no call {here", {"mv"}) == []


def test_an_unknown_category_is_refused_with_the_categories() -> None:
    with pytest.raises(ValueError, match=r"unknown BFCL category .simple.: one of multi_turn_base"):
        bfcl.load_cases("simple")


def test_the_command_records_each_case_once_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    with running(FakeVLLM(steps=2)) as url:
        argv = ["--limit", "2", "--base-url", url, "--verifier-url", url, "--out", str(out)]
        assert command.main([*argv, "--gate", "mur", "--gamma", "0.9"]) == 0
        first = capsys.readouterr().out
        assert command.main([*argv, "--gate", "mur", "--gamma", "0.9"]) == 0
        again = capsys.readouterr().out
        assert command.main([*argv, "--gate", "always"]) == 2  # another setting, same folder
    assert "2 cases, 0 already" in first and "multi_turn_base_1: " in first
    assert "2 cases, 2 already" in again
    records = load_records(out)
    assert sorted(r["problem_id"] for r in records) == ["multi_turn_base_0", "multi_turn_base_1"]
    assert all(not r["correct"] and r["gamma"] == 0.9 for r in records)  # no call was made
    assert "mur experiment bfcl --limit 2" in (out / "command.txt").read_text()
    assert "say one --gate" not in capsys.readouterr().err


def test_the_command_refuses_two_gates_in_one_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["--out", "x", "--gate", "mur,random"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mur experiment bfcl: error: give one --gate and one --gamma: a folder holds one setting"
    )


def test_make_setup_installs_what_the_missing_line_names() -> None:
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    [line] = [line for line in makefile.splitlines() if "bfcl-eval==" in line]
    assert line.strip().endswith(bfcl.INSTALL.removeprefix("pip "))
