"""A scripted tool-calling chat model for agent tests: each call answers with the next scripted
reply, as vLLM would (tool calls parsed out of a Hermes `<tool_call>` block whose tokens the
logprobs cover, logprobs only when the request asks for them, usage with the generated
tokens), and records what it was asked."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from mur.testing.scripted_chat import Scripted

PROMPT_TOKENS = 10


@dataclass(frozen=True)
class Said:
    """One scripted reply: the logprob of each generated token, and what it says (text, or
    tool calls as (name, arguments))."""

    logprobs: Sequence[float]
    text: str = ""
    calls: Sequence[tuple[str, dict[str, Any]]] = ()
    first_alternatives: Sequence[tuple[str, float]] = ()
    """The first token's top logprobs (token, logprob), returned when the request asks for
    top logprobs; the other tokens have none."""

    def generated(self) -> str:
        """The text the model generated, tool calls in Hermes form as vLLM's parser reads them."""
        blocks = (
            f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
            for name, args in self.calls
        )
        return self.text + "".join(blocks)


def says(text: str, uncertainty: float, tokens: int = 3) -> Said:
    """A reply in words whose every token has logprob -uncertainty."""
    return Said([-uncertainty] * tokens, text=text)


def calls(name: str, args: dict[str, Any], uncertainty: float, tokens: int = 4) -> Said:
    """A reply that calls one tool, every token at logprob -uncertainty."""
    return Said([-uncertainty] * tokens, calls=[(name, args)])


class ScriptedAgentModel(BaseChatModel):
    """Answers call after call with `script` (popped in order; one more call is an error)."""

    script: list[Said]
    model_name: str = "scripted-agent"
    serves_logprobs: bool = True
    asked: list[dict[str, Any]] = Field(default_factory=list)
    """Each request: its messages and the request's settings (tools, logprobs, ...)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @property
    def _llm_type(self) -> str:
        return "scripted-agent-model"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        return self.bind(tools=schemas, tool_choice=tool_choice, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.asked.append({"messages": list(messages), "settings": kwargs})
        if not self.script:
            raise AssertionError(f"{self.model_name} was called more often than scripted")
        said = self.script.pop(0)
        number = len(self.asked)
        metadata: dict[str, Any] = {
            "model_name": self.model_name,
            "finish_reason": "tool_calls" if said.calls else "stop",
        }
        if kwargs.get("logprobs") and self.serves_logprobs:
            tops = [list(said.first_alternatives)] + [[] for _ in said.logprobs[1:]]
            asked_tops = tops if kwargs.get("top_logprobs") else None
            entries = Scripted(said.generated(), said.logprobs, top_logprobs=asked_tops).entries()
            metadata["logprobs"] = {"content": entries}
        generated = len(said.logprobs)
        message = AIMessage(
            content=said.text,
            tool_calls=[
                {"name": name, "args": args, "id": f"{self.model_name}-{number}-{index}"}
                for index, (name, args) in enumerate(said.calls)
            ],
            response_metadata=metadata,
            usage_metadata=UsageMetadata(
                input_tokens=PROMPT_TOKENS,
                output_tokens=generated,
                total_tokens=PROMPT_TOKENS + generated,
            ),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])
