"""servers.router: least-loaded routing over replicas, failover, and what callers read through.

Fakes for the routing itself (no network); the loopback fault server and a closed port for
what the real client raises when a replica is gone.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import openai
import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult

import run
from fakes import FakeLogprobChat, Scripted
from faulty_server import MODEL, faulty_server
from graphs import Context, build_graph
from nodes.llm import Request, generate, is_transient
from servers import ServerError, VLLMChatOpenAI, make_chat_model
from servers.router import RoutedChatModel, make_routed_model, refused, split_urls

QUESTION = [HumanMessage("2 + 2?")]


def reply(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted | list[Scripted]:
    """One choice of 3 tokens, or n of them when n is asked for."""
    choice = Scripted(" 4", [-0.1, -0.2, -0.3], stop_reason=None)
    n = kwargs.get("n", 1)
    return [choice] * n if n > 1 else choice


class SlowFake(FakeLogprobChat):
    """A fake replica whose async calls take time (or wait for `release`), tracking overlap."""

    delay: float = 0.0
    release: asyncio.Event | None = None
    running: int = 0
    peak: int = 0

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delay)
            if self.release is not None:
                await self.release.wait()
            return self._generate(messages, stop=stop, **kwargs)
        finally:
            self.running -= 1


def fakes(count: int = 2, **fields: Any) -> list[SlowFake]:
    return [SlowFake(responder=reply, **fields) for _ in range(count)]


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def client(url: str) -> VLLMChatOpenAI:
    # No client-side retries: each refusal reaches the router at once.
    return make_chat_model(url, MODEL, max_retries=0, timeout=10)


# ------------------------------------------------------------------------------ routing


async def test_concurrent_calls_spread_evenly_over_equal_replicas() -> None:
    a, b = fakes(delay=0.05)
    routed = RoutedChatModel(replicas=[a, b])
    await asyncio.gather(*(routed.ainvoke(QUESTION) for _ in range(8)))
    assert (len(a.calls), len(b.calls)) == (4, 4)
    assert (a.peak, b.peak) == (4, 4)
    assert routed.served == [4, 4] and routed.in_flight == [0, 0]


async def test_a_busy_replica_gets_nothing_while_another_is_idle() -> None:
    release = asyncio.Event()
    slow = SlowFake(responder=reply, release=release)
    fast = SlowFake(responder=reply)
    routed = RoutedChatModel(replicas=[slow, fast])
    blocked = asyncio.create_task(routed.ainvoke(QUESTION))
    await asyncio.sleep(0.01)
    assert routed.in_flight == [1, 0]
    for _ in range(5):  # round-robin alone would send every other one to `slow`
        await routed.ainvoke(QUESTION)
    assert routed.served == [1, 5]
    release.set()
    await blocked
    assert routed.in_flight == [0, 0] and len(slow.calls) == 1


async def test_ties_take_turns() -> None:
    a, b, c = fakes(3)
    routed = RoutedChatModel(replicas=[a, b, c])
    for _ in range(7):
        await routed.ainvoke(QUESTION)
    assert routed.served == [3, 2, 2]


def test_the_sync_path_routes_too() -> None:
    a, b = fakes()
    routed = RoutedChatModel(replicas=[a, b])
    for _ in range(4):
        assert routed.invoke(QUESTION).content == " 4"
    assert (len(a.calls), len(b.calls)) == (2, 2)


async def test_cancelled_calls_free_their_slot() -> None:
    (blocking,) = fakes(1, release=asyncio.Event())
    routed = RoutedChatModel(replicas=[blocking])
    task = asyncio.create_task(routed.ainvoke(QUESTION))
    await asyncio.sleep(0.01)
    assert routed.in_flight == [1]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert routed.in_flight == [0]


# ------------------------------------------------------------- what callers see through it


async def test_kwargs_reach_the_replica_unchanged() -> None:
    a, b = fakes()
    routed = RoutedChatModel(replicas=[a, b])
    kwargs = {"max_tokens": 7, "extra_body": {"top_k": 3}, "top_logprobs": 2}
    await routed.agenerate([QUESTION], stop=["\n"], **kwargs)
    await b.agenerate([QUESTION], stop=["\n"], **kwargs)  # the same call, direct
    assert a.calls[0]["kwargs"] == b.calls[0]["kwargs"] == {**kwargs, "stop": ["\n"]}


def test_extra_body_and_n_choices_pass_through() -> None:
    vllm = [make_chat_model(f"http://127.0.0.1:{p}/v1", MODEL, top_k=5) for p in (1, 2)]
    routed = RoutedChatModel(replicas=vllm)
    assert routed.extra_body == vllm[0].extra_body == {"top_k": 5}
    assert routed.supports_n_choices is True
    assert routed.model_name == MODEL
    assert routed.openai_api_base == "http://127.0.0.1:1/v1,http://127.0.0.1:2/v1"
    # One replica that cannot keep per-choice logprobs: n > 1 must be separate requests.
    mixed = RoutedChatModel(replicas=[vllm[0], FakeLogprobChat(responder=reply)])
    assert mixed.supports_n_choices is False


async def test_tokens_are_counted_once_per_reply() -> None:
    a, b = fakes(supports_n_choices=True)
    routed = RoutedChatModel(replicas=[a, b])
    request = Request(messages=QUESTION, max_tokens=8, n=3, continue_final_message=False)
    one = await generate(routed, request)
    assert (one.completion_tokens, one.prompt_tokens, one.calls) == (9, 10, 1)
    assert len(one.choices) == 3 and routed.served == [1, 0]
    # Without n-choice support every choice is its own request, spread over the replicas.
    c, d = fakes()
    spread = await generate(RoutedChatModel(replicas=[c, d]), request)
    assert (spread.completion_tokens, spread.prompt_tokens, spread.calls) == (9, 30, 3)
    assert (len(c.calls), len(d.calls)) == (2, 1)


async def test_the_graph_runs_over_routed_replicas_with_exact_usage() -> None:
    with faulty_server(["ok"]) as one, faulty_server(["ok"]) as two:
        routed = make_routed_model([one.base_url, two.base_url], max_retries=0)
        graph = build_graph("critic", backbone=routed)
        results = await asyncio.gather(
            *(
                graph.ainvoke({"question": "2 + 2?"}, context=Context(gate="never", max_steps=2))
                for _ in range(4)
            )
        )
    assert [r["answer"] for r in results] == ["4"] * 4
    calls = sum(r["usage"]["llm_calls"] for r in results)
    assert calls == one.requests + two.requests and one.requests > 0 and two.requests > 0
    # The fault server reports 13 completion tokens per reply: each counted exactly once.
    assert sum(r["usage"]["backbone_tokens"] for r in results) == 13 * calls


# ------------------------------------------------------------------------------- failover


async def test_a_replica_that_refuses_connections_is_skipped() -> None:
    now = [0.0]
    with faulty_server(["ok"]) as alive:
        routed = RoutedChatModel(
            replicas=[client(closed_port_url()), client(alive.base_url)],
            cool_off_s=5.0,
            clock=lambda: now[0],
        )
        assert (await routed.ainvoke(QUESTION)).content
        assert routed.served == [1, 1] and alive.requests == 1
        # In cool-off: not even tried.
        await routed.ainvoke(QUESTION)
        assert routed.served == [1, 2] and alive.requests == 2
        # Cool-off over: tried again, refused again, and the request still succeeds.
        now[0] = 6.0
        await routed.ainvoke(QUESTION)
        assert routed.served == [2, 3] and alive.requests == 3
    assert routed.in_flight == [0, 0]


async def test_when_every_replica_refuses_the_last_error_is_raised() -> None:
    routed = RoutedChatModel(replicas=[client(closed_port_url()), client(closed_port_url())])
    with pytest.raises(openai.APIConnectionError) as info:
        await routed.ainvoke(QUESTION)
    assert routed.served == [1, 1]
    assert refused(info.value) and is_transient(info.value)  # the graph's retry policy applies
    # Both in cool-off: the next request still tries each once rather than failing unseen.
    with pytest.raises(openai.APIConnectionError):
        await routed.ainvoke(QUESTION)
    assert routed.served == [2, 2]


async def test_a_server_error_is_not_sent_to_another_replica() -> None:
    # A 500 may come from a request the replica was working on: the caller's retry decides.
    with faulty_server(["500"]) as failing, faulty_server(["ok"]) as alive:
        routed = RoutedChatModel(replicas=[client(failing.base_url), client(alive.base_url)])
        with pytest.raises(openai.InternalServerError):
            await routed.ainvoke(QUESTION)
        assert (failing.requests, alive.requests) == (1, 0)
        await routed.ainvoke(QUESTION)  # not marked down: the tie goes round to `alive`
        assert alive.requests == 1


def test_refused_looks_through_the_client_wrappers() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert refused(outer)
    assert not refused(TimeoutError("slow"))
    assert not refused(ValueError("bad"))


# -------------------------------------------------------------------------- construction


def test_split_urls() -> None:
    assert split_urls(" http://a:1/v1, http://b:2/v1,,") == ["http://a:1/v1", "http://b:2/v1"]
    assert split_urls(["http://a:1/v1,http://a:1/v1", "b:3"]) == [
        "http://a:1/v1",
        "http://a:1/v1",
        "b:3",
    ]
    with pytest.raises(ServerError, match="no server URL"):
        split_urls(" , ")


def test_one_url_gives_a_plain_client() -> None:
    model = make_routed_model("127.0.0.1:9", MODEL, max_tokens=5)
    assert type(model) is VLLMChatOpenAI
    assert model.openai_api_base == "http://127.0.0.1:9/v1" and model.max_tokens == 5


def test_several_urls_are_checked_and_routed() -> None:
    with faulty_server(["ok"]) as server:
        routed = make_routed_model(f"{server.base_url},{server.base_url}", cool_off_s=1.0)
    assert isinstance(routed, RoutedChatModel)
    assert routed.model_name == MODEL and len(routed.replicas) == 2 and routed.cool_off_s == 1.0


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """What each fake URL serves (GET /v1/models), without servers."""
    table: dict[str, list[str]] = {}
    monkeypatch.setattr("servers.router.check_endpoint", lambda url: table[url])
    return table


def test_replicas_serving_different_models_are_refused(served: dict[str, list[str]]) -> None:
    served.update({"http://a:1/v1": ["model-a"], "http://b:2/v1": ["model-b"]})
    with pytest.raises(ServerError, match=r"http://a:1/v1 serves \['model-a'\].*model-b"):
        make_routed_model(["http://a:1/v1", "http://b:2/v1"])
    # A named model must be listed by every replica.
    served["http://b:2/v1"] = ["model-b", "model-a"]
    assert make_routed_model(["a:1", "b:2"], "model-a").model_name == "model-a"
    with pytest.raises(ServerError, match="'model-b'"):
        make_routed_model(["a:1", "b:2"], "model-b")
    served["http://b:2/v1"] = []
    with pytest.raises(ServerError, match="no model"):
        make_routed_model(["a:1", "b:2"])


def test_cli_connect_routes_a_comma_separated_base_url() -> None:
    with faulty_server(["ok"]) as one, faulty_server(["ok"]) as two:
        urls = f"{one.base_url},{two.base_url}"
        args = run.build_parser().parse_args(
            ["--strategy", "critic", "--base-url", urls, "--verifier-url", two.base_url]
        )
        connection = run.connect(args, say=lambda _: None)
    assert isinstance(connection.backbone, RoutedChatModel)
    assert type(connection.verifier) is VLLMChatOpenAI
    assert connection.note == (
        f"backbone {MODEL} at {urls} (2 replicas); verifier {MODEL} at {two.base_url}"
    )
