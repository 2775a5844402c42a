"""Chat completions as they went over the wire, for live tests that must not trust the code
under test: a test checks the graph's numbers against the server's own replies (token
logprobs, texts, usage), recomputed in the test.

    recorder = Recorder()
    model = recording_model(server.base_url, server.model, recorder)   # a shipped client
    ... run the graph with `model` ...
    for exchange in recorder.exchanges: exchange.request, exchange.response
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import openai

from mur.nodes.llm import Reply, Request, generate
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.clients.http_pool import pooled_async_http_client, sdk_http_module


@dataclass
class Exchange:
    """One chat completion: the request body sent and the reply body received."""

    request: dict[str, Any]
    response: dict[str, Any]
    raw: bytes = field(default=b"", repr=False)  # the reply's bytes as they came

    @property
    def choices(self) -> list[dict[str, Any]]:
        return sorted(self.response["choices"], key=lambda choice: choice["index"])

    @property
    def message(self) -> dict[str, Any]:
        return self.choices[0]["message"]

    @property
    def raw_text(self) -> str:
        """All the text the server returned in the first choice, wherever it filed it."""
        return choice_text(self.choices[0])

    @property
    def completion_tokens(self) -> int:
        return int(self.response["usage"]["completion_tokens"])

    @property
    def last_content(self) -> str:
        return str(self.request["messages"][-1]["content"])

    def mentions(self, text: str) -> bool:
        """Whether any message of the request holds `text` (e.g. one question of several)."""
        return any(text in str(message.get("content")) for message in self.request["messages"])


def choice_text(choice: dict[str, Any]) -> str:
    """A choice's text, reasoning parser or not."""
    message = choice["message"]
    return (message.get("reasoning") or "") + (message.get("content") or "")


def choice_logprobs(choice: dict[str, Any]) -> list[float]:
    """The token logprobs of one choice, as the server sent them."""
    return [float(token["logprob"]) for token in choice["logprobs"]["content"]]


class Recorder:
    """Records every chat completion a client makes (an httpx response hook), in the order
    the replies arrived."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    async def on_response(self, response: Any) -> None:
        if not response.request.url.path.endswith("/chat/completions"):
            return
        await response.aread()
        if response.status_code == 200:
            request = json.loads(response.request.content)
            self.exchanges.append(Exchange(request, response.json(), response.content))


def recording_model(base_url: str, model: str, recorder: Recorder, **overrides: Any) -> Any:
    """The shipped chat model (servers.clients.chat_models.make_chat_model), its replies
    recorded."""
    client = pooled_async_http_client()
    client.event_hooks["response"].append(recorder.on_response)
    return make_chat_model(base_url, model, http_async_client=client, **overrides)


def replaying_client(body: bytes, asked: list[dict[str, Any]]) -> Any:
    """An HTTP client for the SDK whose every request gets `body` (a recorded reply); each
    request's JSON lands in `asked`."""
    http = sdk_http_module()

    def handler(request: Any) -> Any:
        asked.append(json.loads(request.content))
        return http.Response(200, content=body, headers={"content-type": "application/json"})

    return openai.DefaultAsyncHttpxClient(transport=http.MockTransport(handler))


def read_both(
    body: bytes, request: Request, model: str = "recorded"
) -> tuple[Reply, Reply, list[dict[str, Any]]]:
    """The reply `body` read by the project's lean reader and by the stock ChatOpenAI path
    (`raw_replies=False`), for `request` to `model`; and the two request bodies that went
    out."""
    asked: list[dict[str, Any]] = []
    replies = []
    for raw in (True, False):
        client = replaying_client(body, asked)
        chat = make_chat_model(
            "http://recorded.test/v1", model, raw_replies=raw, http_async_client=client
        )
        replies.append(asyncio.run(generate(chat, request)))
    return replies[0], replies[1], asked
