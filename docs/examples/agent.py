"""An agent whose own model is a plain ChatOpenAI and whose tool is MUR.

    pip install "langchain>=1.0"     # create_agent (a dev dependency here: make setup has it)
    python docs/examples/agent.py "A box holds 3^4 - 2^5 apples. How many apples?"

The agent is LangChain's `create_agent` (langchain.agents, LangChain 1.x: the maintained
successor of LangGraph's prebuilt `create_react_agent`, deprecated since LangGraph 1.0), its
model a `ChatOpenAI` against the same vLLM server MUR reasons with, and its tool
`mur_tool(...)`: the model calls MUR with the question (it must call a tool before it answers:
`consult_mur_first`) and gets the answer with a short account (steps, scaled steps, tokens),
then answers. The server must return tool calls:
the embedded Qwen profiles and the GPU Qwen3 ones serve them (vLLM's
`--enable-auto-tool-choice --tool-call-parser hermes`); against a server that does not, this
example stops with one line saying so, never with an answer that skipped the tool.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import openai
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, ModelResponse, wrap_model_call
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langchain_openai import ChatOpenAI

from mur import ChatMUR, mur_tool
from mur.servers.connect import connect

SYSTEM = (
    "You answer questions. For any arithmetic or math, call the mur_reason tool with the "
    "whole question and answer with the number it returns."
)
NO_TOOL_CALLS = (
    "the model at {url} answered without calling the tool: its server must return tool calls "
    "(vLLM: --enable-auto-tool-choice --tool-call-parser hermes; the embedded Qwen profiles "
    "have them)"
)


class NoToolCalls(RuntimeError):
    """The agent's model never called the tool: its server serves no tool calls."""


@wrap_model_call
async def consult_mur_first(
    request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
) -> ModelResponse:
    """Until a tool has answered, the model must call one (`tool_choice="required"`, which
    vLLM enforces by guided decoding); then it answers in words, offered no tool. Small models
    do not pick or leave a tool reliably: asked with `"auto"`, the embedded
    Qwen2.5-Coder-1.5B writes a call as a ```json block the server's parser does not read,
    before MUR's answer and after it."""
    if any(isinstance(message, ToolMessage) for message in request.messages):
        return await handler(request.override(tools=[], tool_choice=None))
    return await handler(request.override(tool_choice="required"))


def build_agent(model: BaseChatModel, llm: ChatMUR) -> Any:
    """A tool-calling agent with MUR as its one tool, consulted before it answers."""
    return create_agent(
        model, tools=[mur_tool(llm)], system_prompt=SYSTEM, middleware=[consult_mur_first]
    )


async def ask(agent: Any, question: str, url: str) -> tuple[str, ToolMessage]:
    """The agent's answer and MUR's tool message; NoToolCalls (one line) when the model did not
    call the tool, or its server refused tool calls."""
    try:
        state = await agent.ainvoke({"messages": [("user", question)]})
    except openai.BadRequestError as exc:
        if "tool" in str(exc):
            raise NoToolCalls(f"{NO_TOOL_CALLS.format(url=url)}: {exc.message}") from None
        raise
    tools = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    if not tools:
        raise NoToolCalls(NO_TOOL_CALLS.format(url=url))
    return str(state["messages"][-1].content), tools[-1]


def main(argv: Sequence[str] | None = None) -> int:
    import asyncio  # noqa: PLC0415

    words = argv if argv is not None else sys.argv[1:]
    question = " ".join(words) or "A box holds 3^4 - 2^5 apples. How many apples are in it?"
    servers = connect(start=True, progress=True)
    url, name = servers.backbone.openai_api_base, servers.backbone.model_name
    model = ChatOpenAI(base_url=url, model=name, api_key="EMPTY", temperature=0, max_tokens=256)
    llm = ChatMUR(backbone=servers.backbone, verifier=servers.verifier, strategy="critic")
    try:
        answer, used = asyncio.run(ask(build_agent(model, llm), question, url))
    except NoToolCalls as exc:
        print(f"agent.py: error: {exc}", file=sys.stderr)
        return 1
    print(f"MUR said: {used.content}\nThe agent answers: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
