"""Every attempt of a model-calling node counts, and sibling requests of a failure stop."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.types import RetryPolicy

from fakes import FakeLogprobChat, Scripted
from mur.graphs.attempts import AttemptLedger
from mur.graphs.model_calls import MODEL_RETRY
from mur.graphs.mur import build_graph
from mur.graphs.state import Context
from mur.nodes.llm import Request, gather_all, generate
from mur.nodes.usage import Usage, metered
from mur.servers.clients.transport_errors import is_transient


def is_judge(messages: list[BaseMessage]) -> bool:
    return isinstance(messages[0], HumanMessage) and "You are a teacher" in str(messages[0].content)


def critic_script(failures: dict[str, int]):
    """Step 1 is scaled: judged wrong, revised (the revision states the answer). The first
    `failures["revise"]` revisions fail with a dropped connection."""

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if is_judge(messages):
            return Scripted("Wrong. \\boxed{No}", [-0.1] * 5, stop_reason=None)
        if "incorrect" in str(messages[-2].content):
            if failures["revise"] > 0:
                failures["revise"] -= 1
                raise ConnectionError("connection reset by peer")
            return Scripted(" so the answer is 7.", [-0.2] * 3, stop_reason=None)
        return Scripted(" draft", [-0.5] * 4)

    return respond


async def test_only_the_failed_node_of_a_strategy_is_retried_and_its_failure_counts() -> None:
    model = FakeLogprobChat(responder=critic_script({"revise": 1}))
    graph = build_graph(backbone=model)
    result = await graph.ainvoke({"question": "3 + 4?"}, context=Context(gate="always"))
    assert result["answer"] == "7"
    # draft; critique; failed revise (attempt 1); revise (attempt 2): the critique stands
    assert len(model.calls) == 4
    assert result["usage"] == {
        "backbone_tokens": 4 + 3,
        "external_tokens": 5,
        "backbone_prompt_tokens": 2 * 10,
        "external_prompt_tokens": 10,
        "llm_calls": 3,
        "failed_calls": 1,
    }


def forced_verdict_script(failures: dict[str, int]):
    """Step 1 states the answer and is scaled; its judgement gives no verdict, so the critique
    continues it from the verdict line: two requests in one node. The first
    `failures["continue"]` continuations fail with a dropped connection."""

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if is_judge(messages):
            if len(messages) == 2:  # the judgement so far, continued from the verdict line
                if failures["continue"] > 0:
                    failures["continue"] -= 1
                    raise ConnectionError("connection reset by peer")
                return Scripted("Yes}", [-0.1] * 2, stop_reason=None)
            return Scripted("The step looks fine.", [-0.1] * 6, stop_reason=None)
        return Scripted(" so the answer is 7.", [-0.5] * 4, stop_reason=None)

    return respond


async def test_a_retried_node_keeps_the_usage_of_the_calls_it_had_made() -> None:
    model = FakeLogprobChat(responder=forced_verdict_script({"continue": 1}))
    graph = build_graph(backbone=model)
    result = await graph.ainvoke(
        {"question": "3 + 4?"}, context=Context(gate="always", judge_force_verdict=True)
    )
    assert result["answer"] == "7" and result["steps"][0]["refine"]["rounds"][0]["verdict"]
    # draft; judgement + failed continuation (attempt 1); judgement + continuation (attempt 2)
    assert len(model.calls) == 5
    assert result["usage"] == {
        "backbone_tokens": 4,
        "external_tokens": 6 + 6 + 2,  # the first judgement too, though its attempt failed
        "backbone_prompt_tokens": 10,
        "external_prompt_tokens": 3 * 10,
        "llm_calls": 4,
        "failed_calls": 1,
    }


async def test_without_failures_nothing_is_added() -> None:
    model = FakeLogprobChat(responder=critic_script({"revise": 0}))
    graph = build_graph(backbone=model)
    result = await graph.ainvoke({"question": "3 + 4?"}, context=Context(gate="always"))
    assert result["usage"]["llm_calls"] == len(model.calls) == 3
    assert result["usage"]["failed_calls"] == 0


def runtime(task_id: str, attempt: int) -> Any:
    return SimpleNamespace(execution_info=SimpleNamespace(task_id=task_id, node_attempt=attempt))


async def test_the_ledger_forgets_a_task_whose_failure_is_final() -> None:
    ledger = AttemptLedger(RetryPolicy(max_attempts=2, retry_on=is_transient))
    answered = FakeLogprobChat(responder=lambda m, k: Scripted(" x", [-0.1] * 2))

    async def node(state: Any, rt: Any) -> dict:
        await generate(answered, Request(messages=[HumanMessage("q")], max_tokens=4))
        raise ConnectionError("gone")

    counted = ledger.counted(node)
    with pytest.raises(ConnectionError):
        await counted({}, runtime("t", 1))
    assert ledger._lost == {"t": Usage(2, 0, 10, 0, 1, 0)}  # kept for the retry
    with pytest.raises(ConnectionError):
        await counted({}, runtime("t", 2))
    assert ledger._lost == {}  # the last attempt: nothing left behind

    async def refused(state: Any, rt: Any) -> dict:
        raise ValueError("not worth retrying")

    with pytest.raises(ValueError):
        await ledger.counted(refused)({}, runtime("u", 1))
    assert ledger._lost == {}


async def test_gather_all_cancels_the_siblings_of_a_failure() -> None:
    cancelled = asyncio.Event()

    async def slow() -> int:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    async def failing() -> int:
        await asyncio.sleep(0)
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError, match="reset"):  # the error itself, not a group
        await asyncio.wait_for(gather_all(slow(), failing()), timeout=10)
    assert cancelled.is_set()
    assert await gather_all(asyncio.sleep(0, result=1), asyncio.sleep(0, result=2)) == [1, 2]


async def test_the_meter_counts_answered_and_failed_requests() -> None:
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if "fail" in str(messages[-1].content):
            raise ConnectionError("reset")
        return Scripted(" ok", [-0.1] * 3)

    model = FakeLogprobChat(responder=respond)
    with metered() as meter:
        await generate(model, Request(messages=[HumanMessage("q")], max_tokens=4))
        await generate(model, Request(messages=[HumanMessage("q")], max_tokens=4, role="external"))
        with pytest.raises(ConnectionError):
            await generate(model, Request(messages=[HumanMessage("fail")], max_tokens=4))
    assert meter.total() == Usage(3, 3, 10, 10, 2, 1)
    assert MODEL_RETRY.max_attempts == 3


async def test_meters_nest_so_a_run_wide_meter_sees_every_attempt_in_flight() -> None:
    model = FakeLogprobChat(responder=lambda messages, kwargs: Scripted(" ok", [-0.1] * 3))
    request = Request(messages=[HumanMessage("q")], max_tokens=4)

    async def attempt() -> Usage:
        with metered() as inner:  # what the graph does for each attempt of a node
            await generate(model, request)
        return inner.total()

    with metered() as run:
        tasks = [asyncio.create_task(attempt()) for _ in range(3)]  # tasks inherit the meter
        inner_totals = await asyncio.gather(*tasks)
        mid = run.answered.generated_tokens  # counted as answered, not when the run ends
    assert inner_totals == [Usage(3, 0, 10, 0, 1, 0)] * 3
    assert mid == 9 and run.total() == Usage(9, 0, 30, 0, 3, 0)
    await generate(model, request)  # outside every meter: nobody counts it
    assert run.total().llm_calls == 3


# ------------------------------------------------------------------------ context overflow


def overflow_error(prompt_tokens: int = 5000) -> Exception:
    """The HTTP 400 the OpenAI SDK raises for vLLM's context-length refusal."""
    import httpx2
    import openai

    from faulty_server import overflow_message

    message = overflow_message(prompt_tokens, 64)
    request = httpx2.Request("POST", "http://vllm/v1/chat/completions")
    response = httpx2.Response(400, request=request, json={"error": {"message": message}})
    return openai.BadRequestError(message, response=response, body={"message": message})


async def test_a_refine_that_overflows_keeps_the_draft_and_ends_the_solution() -> None:
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if is_judge(messages):  # the judge's prompt is the longer one
            raise overflow_error()
        return Scripted(" draft", [-0.5] * 4)

    model = FakeLogprobChat(responder=respond)
    result = await build_graph(backbone=model).ainvoke(
        {"question": "3 + 4?"}, context=Context(gate="always")
    )
    assert result["finish_reason"] == "context_length"
    (step,) = result["steps"]
    assert step["text"] == "draft" and step["scaled"]
    assert "maximum context length is 4096" in step["refine"]["context_length"]
    assert result["usage"]["llm_calls"] == 1 and result["usage"]["failed_calls"] == 1


async def test_a_strategy_that_overflows_later_keeps_what_its_earlier_nodes_spent() -> None:
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if is_judge(messages):
            return Scripted("Wrong. \\boxed{No}", [-0.1] * 5, stop_reason=None)
        if "incorrect" in str(messages[-2].content):  # the revision: the longest prompt
            raise overflow_error()
        return Scripted(" draft", [-0.5] * 4)

    model = FakeLogprobChat(responder=respond)
    result = await build_graph(backbone=model).ainvoke(
        {"question": "3 + 4?"}, context=Context(gate="always")
    )
    assert result["finish_reason"] == "context_length"
    (step,) = result["steps"]
    assert step["text"] == "draft" and step["refine"]["strategy"] == "critic"
    assert "maximum context length is 4096" in step["refine"]["context_length"]
    # The draft and the critique answered before the revision overflowed.
    assert result["usage"] == {
        "backbone_tokens": 4,
        "external_tokens": 5,
        "backbone_prompt_tokens": 10,
        "external_prompt_tokens": 10,
        "llm_calls": 2,
        "failed_calls": 1,
    }


async def test_an_answer_request_that_overflows_ends_without_a_fallback() -> None:
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if str(messages[-1].content).endswith("answer is"):
            raise overflow_error()
        return Scripted(" step", [-0.5] * 4)

    model = FakeLogprobChat(responder=respond)
    result = await build_graph(backbone=model).ainvoke(
        {"question": "3 + 4?"}, context=Context(gate="never", max_steps=2)
    )
    assert result["finish_reason"] == "context_length" and result["fallback"] is None
    assert len(result["steps"]) == 2 and result["answer"] is None
