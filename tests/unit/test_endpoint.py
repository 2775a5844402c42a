"""The OpenAI-compatible MUR endpoint, driven by the official clients against a real uvicorn.

The backbone is the scripted fake (tests/fakes.py), so every decision is known: with the
gamma-gate, step 2 is uncertain and gets scaled (critic says No, the revision is kept), step 3
states the answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from asgi_server import running
from fakes import FakeLogprobChat, Scripted
from faulty_server import MODEL, faulty_server
from mur.endpoint import MODELS, create_app, model_name
from mur.graphs import STRATEGIES
from mur.integrations.chat import content_of
from mur.nodes.gates import GATES
from mur.servers.clients.chat_models import make_chat_model

DRAFT_M = {1: 1.0, 2: 1.3, 3: 0.15}  # step 3 states the answer
REVISED_M = 0.1
QUESTION = "What is 6 * 7?"
EXPECTED_CONTENT = "Step1: draft step 1\nStep2: revised step 2\nStep3: So the answer is 42.\n"


def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
    """Judge says No; drafts and revisions by step index (from the trailing `StepN:`)."""
    if isinstance(messages[0], HumanMessage) and "You are a teacher" in str(messages[0].content):
        return Scripted("Wrong. \\boxed{No}", [-0.1] * 5, stop_reason=None)
    if str(messages[-1].content).endswith("answer is"):  # the max_steps fallback
        return Scripted(" 42.", [-0.3] * 2, stop_reason=None)
    found = re.findall(r"Step(\d+):$", str(messages[-1].content))
    index = int(found[-1]) if found else 0
    if "incorrect" in str(messages[-2].content):
        return Scripted(f" revised step {index}", [-REVISED_M] * 3)
    if index == 3:
        return Scripted(" So the answer is 42.", [-DRAFT_M[3]] * 6, stop_reason=None)
    return Scripted(f" draft step {index}", [-DRAFT_M[index]] * 4)


@pytest.fixture(scope="module")
def fake() -> FakeLogprobChat:
    return FakeLogprobChat(responder=respond)


@pytest.fixture(scope="module")
def base_url(fake: FakeLogprobChat) -> Iterator[str]:
    with running(create_app(fake)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, model: str = "mur-critic", **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], **kwargs
    )


def test_models_list_every_strategy_and_gate(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert len(ids) == len(STRATEGIES) * len(GATES) == len(MODELS)
    assert {"mur-critic", "mur-best_of_n-always", "mur-foresight-never", "mur-thinking"} <= set(ids)
    assert {"mur-escalate", "mur-escalate-first_token"} <= set(ids)
    assert model_name("critic", "mur") == "mur-critic"


def test_health(base_url: str) -> None:
    reply = httpx.get(base_url.removesuffix("/v1") + "/health")
    assert reply.status_code == 200 and reply.json()["status"] == "ok"


def test_completion_carries_the_solution_and_the_trace(client: openai.OpenAI) -> None:
    reply = ask(client, extra_body={"mur": {"gamma": 0.8, "max_steps": 6}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == EXPECTED_CONTENT
    trace = reply.model_extra["mur"]
    assert "question" not in trace
    assert trace["answer"] == "42" and trace["finish_reason"] == "answer"
    steps = trace["steps"]
    assert [s["index"] for s in steps] == [1, 2, 3]
    assert [s["scaled"] for s in steps] == [False, True, False]
    assert steps[1]["uncertainty"] == pytest.approx(REVISED_M)
    assert steps[1]["refine"]["draft"]["uncertainty"] == pytest.approx(DRAFT_M[2])
    assert steps[0]["momentum_after"] == pytest.approx(0.1 * DRAFT_M[1])
    assert trace["config"]["strategy"] == "critic"
    assert trace["config"]["gate"] == "mur"
    assert trace["config"]["gamma"] == 0.8 and trace["config"]["max_steps"] == 6
    # Drafts 4 + 4 + 6, one revision of 3 (backbone); one judgement of 5 (external).
    usage = trace["usage"]
    assert usage["backbone_tokens"] == 17 and usage["external_tokens"] == 5
    assert reply.usage.completion_tokens == 22
    assert (
        reply.usage.prompt_tokens
        == usage["backbone_prompt_tokens"] + usage["external_prompt_tokens"]
    )
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 22


def test_model_name_selects_the_gate_and_system_message_is_sent(
    client: openai.OpenAI, fake: FakeLogprobChat
) -> None:
    before = len(fake.calls)
    reply = client.chat.completions.create(
        model="mur-critic-never",
        messages=[
            {"role": "system", "content": "You are a helpful math assistant."},
            {"role": "user", "content": "an earlier question"},
            {"role": "assistant", "content": "an earlier answer"},
            {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
        ],
    )
    trace = reply.model_extra["mur"]
    assert trace["config"]["gate"] == "never"
    assert not any(s["scaled"] for s in trace["steps"])
    first = fake.calls[before]["messages"]
    assert isinstance(first[0], SystemMessage)
    assert first[0].content == "You are a helpful math assistant."
    assert str(first[1].content).startswith(QUESTION)


def test_stream_sends_one_chunk_per_kept_step(client: openai.OpenAI) -> None:
    chunks = list(ask(client, stream=True, extra_body={"mur": {"max_steps": 6}}))
    steps, final = chunks[:-1], chunks[-1]
    assert len(steps) == 3
    assert [c.choices[0].delta.content for c in steps] == EXPECTED_CONTENT.splitlines(True)
    assert [c.model_extra["mur_step"]["index"] for c in steps] == [1, 2, 3]
    assert steps[1].model_extra["mur_step"]["scaled"] is True
    assert all(c.choices[0].finish_reason is None for c in steps)
    assert steps[0].choices[0].delta.role == "assistant"
    assert final.choices[0].finish_reason == "stop"
    assert final.model_extra["mur"]["answer"] == "42"
    assert len({c.id for c in chunks}) == 1


def test_stream_usage_chunk_on_request(client: openai.OpenAI) -> None:
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 22
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_max_steps_fallback_ends_the_content(client: openai.OpenAI) -> None:
    reply = ask(client, model="mur-critic-never", extra_body={"mur": {"max_steps": 1}})
    trace = reply.model_extra["mur"]
    assert trace["finish_reason"] == "max_steps" and len(trace["steps"]) == 1
    assert reply.choices[0].message.content.startswith("Step1: draft step 1\n")
    assert reply.choices[0].message.content.endswith(trace["fallback"]["text"])


def test_langchain_chat_openai_invoke_and_stream(base_url: str) -> None:
    llm = ChatOpenAI(base_url=base_url, api_key="unused", model="mur-critic", max_retries=0)
    message = llm.invoke(QUESTION)
    assert message.content == EXPECTED_CONTENT
    assert message.usage_metadata["output_tokens"] == 22
    chunks = [c for c in llm.stream(QUESTION) if c.content]
    assert [c.content for c in chunks] == EXPECTED_CONTENT.splitlines(True)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        ask(client, model="mur-beam")
    error = caught.value.body
    assert error["code"] == "model_not_found" and "mur-beam" in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("mur", "says"),
    [
        ({"gamma": 0}, "gamma"),
        ({"gamma": "high"}, "mur.gamma"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_steps": 2.5}, "mur.max_steps"),
        ({"beam_width": 3}, "mur.beam_width"),
        ({"gate": "always"}, "mur.gate"),
        ({"strategy": "thinking"}, "mur.strategy"),
        ("fast", "mur"),
    ],
)
def test_bad_settings_are_400(client: openai.OpenAI, mur: Any, says: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, extra_body={"mur": mur})
    error = caught.value.body
    assert says in error["message"] and error["code"]
    assert set(error) >= {"message", "type", "code"}


def test_bad_requests_are_400(base_url: str) -> None:
    url = f"{base_url}/chat/completions"
    no_user = httpx.post(url, json={"model": "mur-critic", "messages": [{"role": "system"}]})
    assert no_user.status_code == 400 and "user message" in no_user.json()["error"]["message"]
    empty = httpx.post(
        url, json={"model": "mur-critic", "messages": [{"role": "user", "content": "  "}]}
    )
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    not_json = httpx.post(url, content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"
    two = httpx.post(
        url, json={"model": "mur-critic", "n": 2, "messages": [{"role": "user", "content": "q"}]}
    )
    assert two.status_code == 400 and two.json()["error"]["param"] == "n"


def test_unreachable_backbone_is_502_naming_the_url() -> None:
    dead = "http://127.0.0.1:9/v1"  # discard port: nothing listens
    app = create_app(make_chat_model(dead, "nothing", max_retries=0))
    with running(app) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            ask(client, model="mur-critic-never")
    assert caught.value.status_code == 502
    error = caught.value.body
    assert error["type"] == "server_error"
    assert "backbone" in error["message"] and dead in error["message"]
    assert "unreachable" in error["message"]


@pytest.mark.parametrize(
    ("fault", "says"),
    [("unreachable", "is unreachable"), ("http-error", "refused a request (HTTP 400)")],
    ids=["unreachable", "http-error"],
)
def test_a_failing_verifier_is_502_naming_its_url(fault: str, says: str) -> None:
    """The critic with gate always asks the verifier at step 1; the backbone is fine."""
    with faulty_server(["400"]) as server:
        dead = "http://127.0.0.1:9/v1"  # discard port: nothing listens
        verifier_url = dead if fault == "unreachable" else server.base_url
        verifier = make_chat_model(verifier_url, MODEL, max_retries=0)
        with running(create_app(FakeLogprobChat(responder=respond), verifier)) as url:
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as caught:
                ask(client, model="mur-critic-always")
    assert caught.value.status_code == 502
    error = caught.value.body
    assert error["type"] == "server_error" and error["code"] == "upstream_error"
    assert f"the verifier at {verifier_url} {says}" in error["message"]


def failing_at(step: int) -> FakeLogprobChat:
    """A backbone that breaks (with an error the graph does not retry) at step `step`."""

    def broken(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if str(messages[-1].content).endswith(f"Step{step}:"):
            raise ValueError("the backbone broke")
        return respond(messages, kwargs)

    return FakeLogprobChat(responder=broken)


def test_stream_failing_before_any_step_is_502() -> None:
    with running(create_app(failing_at(1))) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            ask(client, model="mur-critic-never", stream=True)
    assert caught.value.status_code == 502
    assert "the backbone broke" in caught.value.body["message"]


def test_stream_failing_after_a_step_reports_the_error_in_stream() -> None:
    with running(create_app(failing_at(2))) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        received = []
        with pytest.raises(openai.APIError, match="the backbone broke"):
            for chunk in ask(client, model="mur-critic-never", stream=True):
                received.append(chunk)
    assert [c.choices[0].delta.content for c in received] == ["Step1: draft step 1\n"]


def test_content_keeps_the_format_the_backbone_wrote() -> None:
    steps = [{"index": 1, "text": "First."}, {"index": 2, "text": "So the answer is 2."}]
    marker = {"steps": steps, "fallback": None, "config": {"step_format": "marker"}}
    paragraph = {**marker, "config": {"step_format": "paragraph"}}
    assert content_of(marker) == "Step1: First.\nStep2: So the answer is 2.\n"
    assert content_of(paragraph) == "First.\n\nSo the answer is 2.\n\n"


def test_several_traces_vote_and_stream_every_trace(client: openai.OpenAI) -> None:
    """`mur.traces` solves the question several times: the reply is the vote's, its usage
    counts every trace, and the stream sends each trace's steps, then the voted content."""
    settings = {"mur": {"traces": 3, "vote": "momentum"}}
    reply = ask(client, extra_body=settings)
    trace = reply.model_extra["mur"]
    assert trace["answer"] == "42" and len(trace["traces"]) == 3
    assert trace["usage"]["backbone_tokens"] == 3 * 17
    assert reply.usage.completion_tokens == 3 * 22
    assert all(t["weight"] > 0 and t["answer"] == "42" for t in trace["traces"])
    assert reply.choices[0].message.content == EXPECTED_CONTENT
    chunks = list(ask(client, stream=True, extra_body=settings))
    steps, final = chunks[:-1], chunks[-1]
    assert sorted(c.model_extra["mur_step"]["trace"] for c in steps) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == EXPECTED_CONTENT
    assert final.model_extra["mur"]["traces"][0]["tokens"] == 22
    # what `mur solve` prints after the steps: traces drawn, branched, stopped and the tally
    summary = trace["traces_summary"]
    assert summary.startswith("3 traces (0 branched, 0 stopped); vote: 42 x3 (")
    assert final.model_extra["mur"]["traces_summary"] == summary
