"""docs/examples run: the LCEL chain with ChatMUR, and the agent whose tool is MUR, over
scripted models (the agent's own model a scripted tool caller). The agent refuses, in one
line, a model that answers without calling the tool. Live, over the embedded server:
tests/integration/test_reasoning_live.py."""

from __future__ import annotations

from typing import Any

import pytest
from examples import example
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from test_endpoint_runs import CONTENT, Backbone

from mur import ChatMUR

NEVER = {"strategy": "critic", "gate": "never"}


def test_the_chain_answers_through_mur() -> None:
    chain = example("chain").build_chain(ChatMUR(backbone=Backbone().fake, **NEVER))
    assert chain.invoke({"question": "What is 6 * 7?"}) == CONTENT


class ToolCaller(BaseChatModel):
    """An agent's model, scripted: it calls `mur_reason` with the question (unless `calls` is
    False), then answers with the first line of what the tool said."""

    calls: bool = True

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-caller"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        said = [m for m in messages if isinstance(m, ToolMessage)]
        if said or not self.calls:
            text = str(said[-1].content).splitlines()[0] if said else "42, I think."
            return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])
        question = str(messages[-1].content)
        call = {"name": "mur_reason", "args": {"question": question}, "id": "call-1"}
        return ChatResult(generations=[ChatGeneration(message=AIMessage("", tool_calls=[call]))])


async def test_the_agent_calls_mur_and_answers_with_it() -> None:
    agent_example = example("agent")
    agent = agent_example.build_agent(ToolCaller(), ChatMUR(backbone=Backbone().fake, **NEVER))
    answer, used = await agent_example.ask(agent, "What is 6 * 7?", "http://scripted/v1")
    assert answer == "answer: 42"
    assert used.content.startswith("answer: 42\n3 steps, 0 scaled by MUR, ")


async def test_an_agent_model_that_calls_no_tool_is_one_clear_line() -> None:
    agent_example = example("agent")
    agent = agent_example.build_agent(
        ToolCaller(calls=False), ChatMUR(backbone=Backbone().fake, **NEVER)
    )
    with pytest.raises(agent_example.NoToolCalls) as refused:
        await agent_example.ask(agent, "What is 6 * 7?", "http://scripted/v1")
    assert str(refused.value).startswith(
        "the model at http://scripted/v1 answered without calling the tool"
    )
