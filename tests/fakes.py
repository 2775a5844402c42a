"""The scripted chat model (mur.testing.scripted_chat, the package's test doubles) and small
scripts of it, for graph tests."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

from mur.testing.scripted_chat import FakeLogprobChat, Responder, Scripted

__all__ = ["FakeLogprobChat", "Responder", "Scripted", "two_step_model"]


def two_step_model() -> FakeLogprobChat:
    """A model that writes `3 + 4 = 7` as its first step and then the answer 7, whatever it is
    asked (critic judgements included): a command's whole solve in a few calls."""

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if "Step2:" in str(messages[-1].content):
            return Scripted(" So the answer is 7.", [-0.2] * 5, stop_reason=None)
        return Scripted(" 3 + 4 = 7", [-0.4] * 4)

    return FakeLogprobChat(responder=respond)
