"""A scripted chat model that returns OpenAI-format token logprobs: the backbone of the unit
tests (tests/fakes.py) and of the load suites' endpoint (testing/fake_endpoint.py), so
every reply is known in advance. `responder(messages, kwargs)` scripts each reply; the model
records its calls and reports usage like vLLM (completion tokens = generated tokens)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field


@dataclass
class Scripted:
    """One reply choice: its text, per-token logprobs, and how it ended."""

    text: str
    logprobs: Sequence[float]
    stop_reason: str | None = "\nStep"  # None: the model ended the sequence
    finish_reason: str = "stop"
    tokens: Sequence[str] | None = None
    top_logprobs: Sequence[Sequence[tuple[str, float]]] | None = None
    reasoning: str | None = None  # text a server's reasoning parser filed apart from `text`
    prompt_logprobs: Sequence[tuple[str, float]] | None = None
    """The prompt's tokens after the first, with their logprobs (a request that asked for
    vLLM's `prompt_logprobs`)."""

    def entries(self) -> list[dict[str, Any]]:
        whole = (self.reasoning or "") + self.text
        tokens = list(self.tokens) if self.tokens is not None else _split(whole, len(self.logprobs))
        tops = self.top_logprobs or [[] for _ in self.logprobs]
        return [
            {
                "token": token,
                "logprob": lp,
                "top_logprobs": [{"token": t, "logprob": v} for t, v in top],
            }
            for token, lp, top in zip(tokens, self.logprobs, tops, strict=True)
        ]

    def prompt_entries(self) -> list[dict[str, Any] | None] | None:
        """`prompt_logprobs` as vLLM writes them: None for the first token, then one dict
        per token keyed by its id (here its position)."""
        if self.prompt_logprobs is None:
            return None
        return [None] + [
            {str(i): {"logprob": lp, "rank": 1, "decoded_token": token}}
            for i, (token, lp) in enumerate(self.prompt_logprobs, start=1)
        ]


def _split(text: str, n: int) -> list[str]:
    if n == 0:
        return []
    size = max(1, len(text) // n)
    parts = [text[i * size : (i + 1) * size] for i in range(n - 1)]
    parts.append(text[(n - 1) * size :])
    return parts


Responder = Callable[[list[BaseMessage], dict[str, Any]], Scripted | list[Scripted]]


class FakeLogprobChat(BaseChatModel):
    """Answers each request with what `responder(messages, kwargs)` scripts; records calls.

    Usage is reported like vLLM: completion tokens = generated tokens, once per reply.
    """

    responder: Responder
    calls: list[dict[str, Any]] = Field(default_factory=list)
    supports_n_choices: bool = False
    prompt_tokens: int = 10
    streamed_tokens: int = 0
    """Tokens a streamed request yielded before it ended or its reader closed it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @property
    def _llm_type(self) -> str:
        return "fake-logprob-chat"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        kwargs = {**kwargs, "stop": stop}
        self.calls.append({"messages": list(messages), "kwargs": kwargs})
        scripted = self.responder(list(messages), kwargs)
        choices = scripted if isinstance(scripted, list) else [scripted]
        completion = sum(len(c.logprobs) for c in choices)
        usage = {
            "input_tokens": self.prompt_tokens,
            "output_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
        generations = []
        for choice in choices:
            message = AIMessage(
                content=choice.text,
                additional_kwargs=(
                    {"reasoning_content": choice.reasoning} if choice.reasoning else {}
                ),
                usage_metadata=usage,
                response_metadata={
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason,
                    "logprobs": {"content": choice.entries()},
                    **(
                        {"prompt_logprobs": choice.prompt_entries()}
                        if choice.prompt_logprobs is not None
                        else {}
                    ),
                },
            )
            generations.append(ChatGeneration(message=message))
        return ChatResult(generations=generations)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """Stream as the project's vLLM client streams with continuous usage stats: one chunk
        per token, each with its logprob entry and its share of the usage (the prompt on the
        first, one token on each: LangChain adds them up); a reader that closes the stream
        stops it."""
        kwargs = {**kwargs, "stop": stop, "stream": True}
        self.calls.append({"messages": list(messages), "kwargs": kwargs})
        scripted = self.responder(list(messages), kwargs)
        choice = scripted[0] if isinstance(scripted, list) else scripted
        entries = choice.entries()
        for done, entry in enumerate(entries, start=1):
            self.streamed_tokens += 1
            last = done == len(entries)
            prompt = self.prompt_tokens if done == 1 else 0
            usage = UsageMetadata(input_tokens=prompt, output_tokens=1, total_tokens=prompt + 1)
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content=entry["token"],
                    usage_metadata=usage,
                    response_metadata={
                        "logprobs": {"content": [entry]},
                        **(
                            {
                                "finish_reason": choice.finish_reason,
                                "stop_reason": choice.stop_reason,
                            }
                            if last
                            else {}
                        ),
                    },
                )
            )
