"""LangChain's own standard unit tests for chat models (langchain-tests), run on `ChatMUR`
over the scripted backbone. ChatMUR makes no tool calls and honours no schema (it refuses
both in one line), so the suite's tool-calling and structured-output tests are skipped by its
own flags."""

from __future__ import annotations

from typing import Any

from langchain_tests.unit_tests import ChatModelUnitTests

from fakes import two_step_model
from mur import ChatMUR


class TestChatMURStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatMUR]:
        return ChatMUR

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backbone": two_step_model(), "strategy": "critic", "gate": "never"}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False
