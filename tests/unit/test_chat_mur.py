"""`ChatMUR` (integrations/chat_model.py) over the scripted backbone: the endpoint's reply as a
LangChain message (one writer, integrations/chat.py), usage equal to the backbone's own counts,
streamed steps in order, batch, per-call settings, callbacks beneath one run, refusals in one
line; and `mur_tool`, whose failures reach the agent as its error message."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import httpx
import pytest
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from test_endpoint_runs import CONTENT, Backbone

from asgi_server import running
from fakes import FakeLogprobChat, Scripted
from mur import ChatMUR, mur_tool
from mur.endpoint import create_app
from mur.graphs.state import ContextError

NEVER = {"strategy": "critic", "gate": "never"}
QUESTION = "What is 6 * 7?"


GENERATED = 4 + 4 + 6
"""Tokens the scripted backbone generates for QUESTION (its three steps' logprobs)."""


async def test_the_message_is_the_endpoints_reply_with_exact_usage(tmp_path: Any) -> None:
    backbone = Backbone()
    llm = ChatMUR(backbone=backbone.fake, **NEVER)
    message = await llm.ainvoke([SystemMessage("Be brief."), HumanMessage(QUESTION)])
    assert message.content == CONTENT
    meta = message.response_metadata
    assert meta["answer"] == "42" and meta["finish_reason"] == "answer"
    assert meta["model_name"] == "mur-critic-never"
    assert [step["index"] for step in meta["steps"]] == [1, 2, 3]
    assert {"uncertainty", "momentum_before", "momentum_after", "scaled"} <= set(meta["steps"][0])
    usage = message.usage_metadata
    assert usage is not None and usage["output_tokens"] == GENERATED
    assert usage["total_tokens"] == usage["input_tokens"] + GENERATED > GENERATED
    assert "Be brief." in str(backbone.fake.calls[0]["messages"][0].content)

    endpoint_backbone = Backbone()
    with running(create_app(endpoint_backbone.fake)) as url:
        body = {"model": "mur-critic-never", "messages": [{"role": "user", "content": QUESTION}]}
        reply = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()
    assert reply["choices"][0]["message"]["content"] == message.content
    assert reply["usage"]["completion_tokens"] == GENERATED
    assert reply["usage"]["prompt_tokens"] == usage["input_tokens"]
    assert reply["mur"]["steps"] == meta["mur"]["steps"]


async def test_streaming_yields_each_kept_step_in_order_then_the_rest() -> None:
    llm = ChatMUR(backbone=Backbone().fake, **NEVER)
    chunks = [chunk async for chunk in llm.astream(QUESTION)]
    lines = [chunk.content for chunk in chunks]
    assert lines[:3] == [
        "Step1: draft step 1\n",
        "Step2: draft step 2\n",
        "Step3: So the answer is 42.\n",
    ]
    assert [c.response_metadata["mur_steps"][0]["kept"]["index"] for c in chunks[:3]] == [1, 2, 3]
    whole = sum(chunks[1:], chunks[0])
    assert whole.content == CONTENT
    assert whole.response_metadata["answer"] == "42"
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0
    assert len(whole.response_metadata["mur_steps"]) == 3


def test_sync_invoke_batch_and_a_chain() -> None:
    llm = ChatMUR(backbone=Backbone().fake, **NEVER)
    assert llm.invoke(QUESTION).response_metadata["answer"] == "42"
    replies = llm.batch([QUESTION, QUESTION], config={"max_concurrency": 2})
    assert [reply.content for reply in replies] == [CONTENT, CONTENT]
    chain = ChatPromptTemplate.from_messages([("user", "{question}")]) | llm | StrOutputParser()
    assert chain.invoke({"question": QUESTION}) == CONTENT


async def test_settings_per_call_and_bound() -> None:
    backbone = Backbone()
    llm = ChatMUR(backbone=backbone.fake, **NEVER)
    capped = await llm.ainvoke(QUESTION, max_steps=1)
    assert len(capped.response_metadata["steps"]) == 1
    bound = llm.bind(max_steps=2)
    assert len((await bound.ainvoke(QUESTION)).response_metadata["steps"]) == 2
    assert llm.context.max_steps != 1  # the model's own settings are untouched


class Runs(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.parents: dict[UUID, UUID | None] = {}
        self.names: dict[UUID, str] = {}

    async def on_chat_model_start(self, serialized: Any, messages: Any, **kw: Any) -> None:
        self.parents[kw["run_id"]] = kw.get("parent_run_id")
        self.names[kw["run_id"]] = (serialized or {}).get("name") or "chat"

    async def on_chain_start(self, serialized: Any, inputs: Any, **kw: Any) -> None:
        self.parents[kw["run_id"]] = kw.get("parent_run_id")
        self.names[kw["run_id"]] = kw.get("name") or "chain"


async def test_callbacks_see_one_run_with_the_graph_beneath_it() -> None:
    runs = Runs()
    llm = ChatMUR(backbone=Backbone().fake, **NEVER)
    await llm.ainvoke(QUESTION, config={"callbacks": [runs]})
    roots = [run for run, parent in runs.parents.items() if parent is None]
    assert len(roots) == 1, "more than one top-level run"
    assert len(runs.parents) > 3, "the graph's runs were not seen"

    def root_of(run: UUID) -> UUID:
        while (parent := runs.parents.get(run)) is not None:
            run = parent
        return run

    assert {root_of(run) for run in runs.parents} == set(roots)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda llm: ChatMUR(backbone=llm, gamma="high"), "gamma must be a valid number"),
        (lambda llm: ChatMUR(backbone=llm, strategy="nope"), "unknown strategy 'nope'"),
        (lambda llm: ChatMUR(backbone=llm).bind_tools([]), "ChatMUR produces no tool calls"),
        (
            lambda llm: ChatMUR(backbone=llm).with_structured_output(dict),
            "cannot honour a schema",
        ),
        (lambda llm: ChatMUR(backbone=llm).invoke([SystemMessage("hi")]), "no user message"),
        (lambda llm: ChatMUR(backbone=llm).invoke(QUESTION, stop=["x"]), "no stop sequences"),
        (lambda llm: ChatMUR(backbone=llm).invoke(QUESTION, gama=1), "unknown setting 'gama'"),
    ],
    ids=["bad value", "bad strategy", "tools", "structured", "no user", "stop", "unknown"],
)
def test_what_it_cannot_do_is_one_line(make: Any, says: str) -> None:
    with pytest.raises((ContextError, ValueError, NotImplementedError)) as refused:
        make(Backbone().fake)
    assert says in str(refused.value) and "\n" not in str(refused.value)


async def test_the_tool_answers_with_an_account_and_reports_failures_to_the_agent() -> None:
    tool = mur_tool(ChatMUR(backbone=Backbone().fake, **NEVER))
    call = {"name": tool.name, "args": {"question": QUESTION}, "id": "c1", "type": "tool_call"}
    answered = await tool.ainvoke(call)
    assert answered.content.startswith("answer: 42\n3 steps, 0 scaled by MUR, ")
    assert answered.artifact["answer"] == "42"

    def broken(messages: Any, kwargs: Any) -> Scripted:
        raise RuntimeError("the backbone at http://gpu:8000/v1 is unreachable")

    failing = mur_tool(ChatMUR(backbone=FakeLogprobChat(responder=broken), **NEVER))
    failed = await failing.ainvoke({**call, "name": failing.name})
    assert failed.status == "error"
    assert "mur_reason failed" in failed.content and "unreachable" in failed.content
    empty = await tool.ainvoke({**call, "args": {"question": "  "}})
    assert empty.status == "error" and "question" in empty.content
