"""The MUR graph against a scripted fake model: decisions, momentum, answers, token counts."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from fakes import FakeLogprobChat, Scripted
from mur.graphs.mur import build_graph
from mur.graphs.solve import solve as solve_graph
from mur.graphs.state import OUTPUT_KEYS, Context
from mur.nodes.gates import question_seed, replay_decisions

# Draft uncertainty per step (all tokens share one logprob); step 5 states the answer.
DRAFT_M = {1: 1.0, 2: 1.3, 3: 0.2, 4: 2.5, 5: 0.15}
REVISED_M = 0.1


def _step_index(messages: list[BaseMessage]) -> int:
    last = messages[-1]
    found = re.findall(r"Step(\d+):$", str(last.content))
    return int(found[-1]) if found else 0


def is_judge(messages: list[BaseMessage]) -> bool:
    return isinstance(messages[0], HumanMessage) and "You are a teacher" in str(messages[0].content)


def scripted_backbone(verdict: str = "No", answer_at: int = 5):
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if is_judge(messages):
            return Scripted(f"The step is off. \\boxed{{{verdict}}}", [-0.1] * 7, stop_reason=None)
        index = _step_index(messages)
        if isinstance(messages[-2], HumanMessage) and "incorrect" in str(messages[-2].content):
            if index == answer_at:
                return Scripted(" Revised: the answer is 42.", [-REVISED_M] * 3, stop_reason=None)
            return Scripted(f" revised step {index}", [-REVISED_M] * 3)
        if isinstance(messages[-1], AIMessage) and str(messages[-1].content).endswith("answer is"):
            return Scripted(" 42.", [-0.3] * 2, stop_reason=None)
        if index == answer_at:
            return Scripted(" So the answer is 42.", [-DRAFT_M[5]] * 6, stop_reason=None)
        return Scripted(f" draft step {index}", [-DRAFT_M[index]] * 4)

    return respond


async def solve(graph, context: Context, question: str = "What is 6 * 7?") -> tuple[dict, list]:
    solution = await solve_graph(graph, question, context=context)
    return solution.output, solution.steps


async def test_mur_gate_scales_exactly_the_uncertain_steps() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    result, events = await solve(build_graph(backbone=model), Context())
    steps = result["steps"]
    assert set(result) == set(OUTPUT_KEYS)
    assert [s["scaled"] for s in steps] == [False, True, False, True, False]
    assert result["answer"] == "42"
    assert result["finish_reason"] == "answer"
    # Scaled steps keep the revision, and its uncertainty feeds the momentum.
    assert steps[1]["text"] == "revised step 2"
    assert steps[1]["uncertainty"] == pytest.approx(REVISED_M)
    assert steps[1]["refine"]["draft"]["uncertainty"] == pytest.approx(DRAFT_M[2])
    momentum = 0.0
    for step in steps:
        assert step["momentum_before"] == pytest.approx(momentum)
        momentum = 0.9 * momentum + 0.1 * step["uncertainty"]
        assert step["momentum_after"] == pytest.approx(momentum)
    # The recorded trace replays to the same decisions.
    drafts = [s["refine"]["draft"]["uncertainty"] if s["scaled"] else None for s in steps]
    kept = [s["uncertainty"] for s in steps]
    assert replay_decisions("mur", kept, draft_uncertainties=drafts) == [s["scaled"] for s in steps]
    # One custom event per kept step, in order, with the gate's view of it.
    assert [e["index"] for e in events] == [1, 2, 3, 4, 5]
    assert events[1]["threshold"] == pytest.approx(0.1 - math.log(0.9))
    assert events[1]["draft_uncertainty"] == pytest.approx(DRAFT_M[2])


async def test_random_gate_draws_per_question_and_replays() -> None:
    model = FakeLogprobChat(responder=scripted_backbone(verdict="Yes"))
    graph = build_graph(backbone=model)
    patterns = set()
    for k in range(6):
        question = f"What is 6 * 7? (variant {k})"
        result, _ = await solve(graph, Context(gate="random", random_rate=0.5), question)
        scaled = [s["scaled"] for s in result["steps"]]
        kept = [s["uncertainty"] for s in result["steps"]]
        seed = question_seed(0, question)
        assert replay_decisions("random", kept, random_rate=0.5, seed=seed) == scaled
        patterns.add(tuple(scaled))
    assert len(patterns) > 1  # one seed for all questions scaled the same steps in each


async def test_token_accounting_counts_every_generated_token() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    result, _ = await solve(build_graph(backbone=model), Context())
    # Drafts: 4 + 4 + 4 + 4 + 6; two revisions of 3; two judgements of 7 (external).
    assert result["usage"] == {
        "backbone_tokens": 22 + 6,
        "external_tokens": 14,
        "backbone_prompt_tokens": 7 * 10,
        "external_prompt_tokens": 2 * 10,
        "llm_calls": 9,
        "failed_calls": 0,
    }
    assert result["usage"]["llm_calls"] == len(model.calls)


async def test_critic_keeps_the_draft_when_judged_correct() -> None:
    model = FakeLogprobChat(responder=scripted_backbone(verdict="Yes"))
    result, _ = await solve(build_graph(backbone=model), Context(gate="always"))
    assert all(s["scaled"] for s in result["steps"])
    assert result["steps"][1]["text"] == "draft step 2"
    assert result["steps"][1]["refine"]["revised"] is False


async def test_critic_rounds_repeat_judge_and_revise() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    result, _ = await solve(build_graph(backbone=model), Context(gate="always", critic_rounds=2))
    rounds = result["steps"][0]["refine"]["rounds"]
    assert len(rounds) == 2 and all(r["revised"] for r in rounds)


async def test_never_gate_makes_no_external_call() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    result, _ = await solve(build_graph(backbone=model), Context(gate="never"))
    assert not any(s["scaled"] for s in result["steps"])
    assert result["usage"]["external_tokens"] == 0
    assert result["usage"]["llm_calls"] == 5


async def test_max_steps_fallback_asks_for_the_answer() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    result, _ = await solve(build_graph(backbone=model), Context(gate="never", max_steps=3))
    assert len(result["steps"]) == 3
    assert result["finish_reason"] == "max_steps"
    assert result["fallback"] == {"text": "Therefore, the answer is 42.", "num_tokens": 2}
    assert result["answer"] == "42"
    assert result["usage"]["backbone_tokens"] == 3 * 4 + 2


async def test_model_ending_the_sequence_ends_the_solution() -> None:
    def respond(messages, kwargs):
        return Scripted(" I am done", [-0.5] * 3, stop_reason=None)

    result, _ = await solve(
        build_graph(backbone=FakeLogprobChat(responder=respond)), Context(gate="never")
    )
    assert result["finish_reason"] == "end_of_sequence"
    assert result["answer"] is None
    assert len(result["steps"]) == 1


async def test_step_requests_continue_the_kept_steps_and_stop_at_the_next_marker() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    await solve(build_graph(backbone=model), Context(gate="never"))
    third = model.calls[2]
    assert third["messages"][-1].content == "Step1: draft step 1\nStep2: draft step 2\nStep3:"
    assert third["kwargs"]["stop"] == ["\nStep", "Step4:"]
    extra = third["kwargs"]["extra_body"]
    assert extra["continue_final_message"] is True and extra["add_generation_prompt"] is False
    user = third["messages"][0].content
    assert user.startswith("What is 6 * 7?\nAlways end your solution with the phrase")


async def test_system_prompt_is_sent() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    graph = build_graph(backbone=model)
    await graph.ainvoke(
        {"question": "q", "system_prompt": "You are a helpful math assistant."},
        context=Context(gate="never", max_steps=1),
    )
    assert model.calls[0]["messages"][0].content == "You are a helpful math assistant."


async def test_missing_logprobs_is_a_clear_error() -> None:
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from mur.nodes.llm import MissingLogprobsError

    graph = build_graph(backbone=FakeListChatModel(responses=["Step text"]))
    with pytest.raises(MissingLogprobsError, match="logprobs"):
        await graph.ainvoke({"question": "q"}, context=Context(gate="never"))


def test_invalid_settings_fail_before_any_call() -> None:
    with pytest.raises(ValueError, match="gamma"):
        Context(gamma=0)
    with pytest.raises(ValueError, match=r"unknown gate 'sometimes': choose one of never, "):
        Context(gate="sometimes")
    with pytest.raises(ValueError, match=r"unknown strategy 'beam': choose one of critic, "):
        Context(strategy="beam")


async def test_context_as_dict_and_graph_defaults() -> None:
    model = FakeLogprobChat(responder=scripted_backbone())
    graph = build_graph(backbone=model)
    result = await graph.ainvoke({"question": "q"})  # no context: the paper's settings
    assert result["config"] == Context().as_dict()
    result = await graph.ainvoke({"question": "q"}, context={"gate": "always", "max_steps": 2})
    assert result["config"]["gate"] == "always" and len(result["steps"]) == 2
