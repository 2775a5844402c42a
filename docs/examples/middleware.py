"""An agent whose uncertain model calls MUR acts on: `MURMiddleware` in LangChain's create_agent.

    pip install "langchain>=1.0"     # create_agent (a dev dependency here: make setup has it)
    python docs/examples/middleware.py "What is 17 * 23 + 4?"

The agent's model is a plain `ChatOpenAI` against the embedded vLLM server (started if it is
not running) or the server MUR_BASE_URL names, with two arithmetic tools. The middleware asks
every call for token logprobs, measures its uncertainty as MUR measures a step, keeps the
momentum in the agent's state, and draws a call that MUR's gamma-gate flags three times,
keeping the tool call (or answer) most draws agree on. It prints each model call's numbers and
what was done, then the answer and the run's tokens.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI

from mur import MURMiddleware
from mur.servers.connect import connect

SYSTEM = "You answer arithmetic questions. Use the tools for every sum and product."


@tool
def add(a: int, b: int) -> int:
    """The sum a + b."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """The product a * b."""
    return a * b


TOOLS: tuple[BaseTool, ...] = (add, multiply)


def build_agent(
    model: BaseChatModel, *, tools: Sequence[BaseTool] = TOOLS, **middleware: Any
) -> Any:
    """A tool-calling agent over `model` whose calls MUR gates (`middleware`: MURMiddleware's
    settings, e.g. `samples=3` or `escalate_to=stronger_model`, `gamma`, `token_limit`)."""
    return create_agent(
        model, tools=list(tools), system_prompt=SYSTEM, middleware=[MURMiddleware(**middleware)]
    )


def describe(state: dict[str, Any]) -> list[str]:
    """One line per model call of the run: its uncertainty, the momentum, what was done."""
    lines = []
    for message in state["messages"]:
        record = message.response_metadata.get("mur") if isinstance(message, AIMessage) else None
        if record is None or "call" not in record:
            continue
        threshold = record["threshold"]
        lines.append(
            f"call {record['call']}: uncertainty {record['uncertainty']:.3f}, threshold "
            f"{'-' if threshold is None else f'{threshold:.3f}'}, momentum "
            f"{record['momentum_before']:.3f} -> {record['momentum_after']:.3f}: "
            f"{record['action']}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    words = argv if argv is not None else sys.argv[1:]
    question = " ".join(words) or "What is 17 * 23 + 4?"
    servers = connect(start=True, progress=True)
    url, name = servers.backbone.openai_api_base, servers.backbone.model_name
    model = ChatOpenAI(base_url=url, model=name, api_key="EMPTY", temperature=0.7, max_tokens=256)
    agent = build_agent(model, samples=3)
    state = asyncio.run(agent.ainvoke({"messages": [("user", question)]}))
    print("\n".join(describe(state)))
    print(f"The agent answers: {state['messages'][-1].content}")
    print(f"{state['mur_tokens']} tokens generated, momentum {state['mur_momentum']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
