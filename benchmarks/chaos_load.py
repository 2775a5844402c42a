"""The clients of the chaos benchmark (benchmarks/chaos.py): each sends one question at a time
with an idempotency key of its own and retries it, as a client should, until it is answered
(after Retry-After, or a second when the connection died or a stream was cut). Once answered,
the same key is asked once more: the recorded reply, the same id and content, must come back.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from mur.benchmarks.endpoint_load import Ask as LoadAsk
from mur.benchmarks.endpoint_load import Streamed, planned, read_answer, run_clients

RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504}
"""Retried after Retry-After (1 s without), as the OpenAI SDK retries: vllm-router answers 500
when it could not reach a replica at all."""
CONNECTION = "connection"
"""The retry reason of a request that got no complete reply (a dead replica's)."""
REPLAY_S = 120.0
"""How long the second ask of an answered key may take (it may meet a kill too)."""


@dataclass(frozen=True)
class Ask(LoadAsk):
    """One question of the load test's mix (no injected fault), with a key of its own."""

    key: str


@dataclass
class Outcome:
    ask: Ask
    answered: bool = False
    latency: float = 0.0
    content: str = ""
    cid: str = ""
    retries: Counter[str] = field(default_factory=Counter)
    replayed_same: bool | None = None
    error: str = ""


class Incomplete(Exception):
    """A reply that ended before it was whole (a stream without `[DONE]`, an error event)."""


def plan(number: int, stream_share: float, phase: str) -> Ask:
    """Question `number`, as the endpoint's load test plans it."""
    mixed = planned(number, stream_share)
    return Ask(number, mixed.model, mixed.stream, None, f"chaos-{phase}-{number}")


@dataclass(frozen=True)
class Reply:
    """What one attempt got: its status, Retry-After, and a 200's content and id."""

    status: int
    retry_after: float = 1.0
    text: str = ""
    content: str = ""
    cid: str = ""


async def send(client: httpx.AsyncClient, url: str, ask: Ask, stream: bool) -> Reply:
    """One attempt, read whole; Incomplete when a 200 did not arrive whole."""
    body = {**ask.body("fake"), "stream": stream}
    headers = {"Idempotency-Key": ask.key}
    async with client.stream(
        "POST", f"{url}/chat/completions", json=body, headers=headers
    ) as reply:
        if reply.status_code != 200:
            text = (await reply.aread()).decode(errors="replace")
            retry_after = float(reply.headers.get("retry-after", "1"))
            return Reply(reply.status_code, retry_after, text)
        answer = Streamed()
        await read_answer(reply, answer, stream, time.perf_counter())
    if answer.error:
        raise Incomplete(answer.error)
    if stream and not answer.done_events:
        raise Incomplete("the stream ended without [DONE]")
    return Reply(200, content=answer.content, cid=answer.ids[-1] if answer.ids else "")


async def until_answered(
    client: httpx.AsyncClient, url: str, ask: Ask, stream: bool, give_up_at: float
) -> tuple[Reply | None, Counter[str], str]:
    """Retry until a 200 arrives whole; (the reply or None, the retries by reason, the last
    error)."""
    retries: Counter[str] = Counter()
    error = ""
    while time.monotonic() < give_up_at:
        try:
            reply = await send(client, url, ask, stream)
        except (httpx.HTTPError, Incomplete, ValueError, KeyError) as exc:
            retries[CONNECTION] += 1
            error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(1)
            continue
        if reply.status == 200:
            return reply, retries, error
        error = f"HTTP {reply.status}: {reply.text[:200]}"
        if reply.status not in RETRY_STATUSES:
            return None, retries, error
        retries[str(reply.status)] += 1
        await asyncio.sleep(reply.retry_after)
    return None, retries, f"not answered before the end: {error}"


async def solve_one(client: httpx.AsyncClient, url: str, ask: Ask, give_up_at: float) -> Outcome:
    """Ask until answered, check the answer, then ask the same key again and compare."""
    outcome = Outcome(ask)
    start = time.monotonic()
    reply, outcome.retries, outcome.error = await until_answered(
        client, url, ask, ask.stream, give_up_at
    )
    if reply is None:
        return outcome
    outcome.answered, outcome.latency = True, time.monotonic() - start
    outcome.content, outcome.cid = reply.content, reply.cid
    again, _, _ = await until_answered(client, url, ask, False, time.monotonic() + REPLAY_S)
    outcome.replayed_same = (
        again is not None and again.cid == reply.cid and again.content == reply.content
    )
    return outcome


async def load(
    url: str, clients: int, seconds: float, stream_share: float, phase: str, drain: float
) -> list[Outcome]:
    """`clients` clients asking new questions for `seconds`; then each finishes the one it
    holds, giving up `drain` seconds after the end (what is still unanswered then is lost)."""
    numbers = iter(range(10**9))
    outcomes: list[Outcome] = []
    end = time.monotonic() + seconds

    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            ask = plan(next(numbers), stream_share, phase)
            outcomes.append(await solve_one(client, url, ask, end + drain))

    await run_clients(clients, client_loop, 2 * clients, httpx.Timeout(300, connect=10))
    return outcomes
