"""How many sequences to give a server at once: measured on the server, not a constant.

A 2-core CPU server and a GPU batch well at very different widths (servers/README.md, "How
many questions in flight"), so the benchmark runner asks. It sends
8, 16, 32 and 64 concurrent generations of a fixed length and takes the fewest streams whose
throughput is within `NEAR_BEST` of the best: more streams than that only lengthen every
request. A measurement is kept under MUR_HOME keyed by the server's facts (URL, model, vLLM
version, dtype, weight format, CPU), so a resumed run on the same machine does not measure
again and a run on another machine does.

A probe taken while the server, or a server beside it on the same cores (a backbone and its
judge), works for someone else measures the sharing, not the server (on two cores it can rank
the widths backwards). vLLM's generation counter tells: it moves by exactly the
tokens it generated, so tokens beyond the probe's own mean other work. Such a measurement is
used for the run at hand and not kept, and a line says so.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from filelock import FileLock

from mur.servers.clients.errors import ServerUnavailable
from mur.servers.clients.metrics import generation_tokens
from mur.servers.processes.facts import ServerFacts
from mur.servers.processes.paths import mur_home

STREAMS = (8, 16, 32, 64)
NEAR_BEST = 0.9
"""Take the fewest streams that reach this share of the best measured throughput."""
PROBE_TOKENS = 32
"""Tokens each stream generates (ignore_eos): long enough that decoding, not prefill, counts."""
_PROMPT = "Count from one to one hundred in words, separated by commas. Run {i}:"


@dataclass(frozen=True)
class StreamRate:
    streams: int
    tokens_per_s: float


async def _generate(client: httpx.AsyncClient, url: str, model: str, i: int) -> int:
    body = {
        "model": model,
        "prompt": _PROMPT.format(i=i),
        "max_tokens": PROBE_TOKENS,
        "min_tokens": PROBE_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    try:
        reply = await client.post(f"{url}/completions", json=body)
    except httpx.HTTPError as exc:
        raise ServerUnavailable(
            f"measuring throughput: no answer from {url}/completions ({type(exc).__name__}): "
            "is the server up (`mur servers status`)? Or pass --concurrency N"
        ) from None
    if reply.status_code != 200:
        raise ServerUnavailable(
            f"measuring throughput: {url}/completions answered {reply.status_code}: "
            f"{reply.text[:200]}"
        )
    return int(reply.json()["usage"]["completion_tokens"])


@dataclass(frozen=True)
class Probe:
    """One throughput measurement and the tokens it generated itself."""

    rates: list[StreamRate]
    tokens: int


async def measure(
    base_url: str, model: str, streams: Sequence[int] = STREAMS, timeout: float = 600
) -> Probe:
    """Generated tokens per second at each number of concurrent streams, the best of two
    passes (up, then down again), after one warm-up request: a machine shared with other work
    slows a single pass at random, and the best pass is the server's own speed."""
    best: dict[int, float] = {}
    async with httpx.AsyncClient(timeout=timeout) as client:
        total = await _generate(client, base_url, model, -1)
        for width in [*streams, *reversed(streams)]:
            start = time.perf_counter()
            counts = await asyncio.gather(
                *(_generate(client, base_url, model, width * 1000 + i) for i in range(width))
            )
            rate = sum(counts) / (time.perf_counter() - start)
            best[width] = max(rate, best.get(width, 0.0))
            total += sum(counts)
    return Probe([StreamRate(width, best[width]) for width in streams], total)


def choose(rates: Sequence[StreamRate], near_best: float = NEAR_BEST) -> int:
    """The fewest streams within `near_best` of the best throughput."""
    best = max(rate.tokens_per_s for rate in rates)
    return min(rate.streams for rate in rates if rate.tokens_per_s >= near_best * best)


def _key(facts: ServerFacts) -> str:
    return "|".join(
        str(part)
        for part in (
            facts.base_url,
            facts.model,
            facts.vllm_version,
            facts.dtype,
            facts.weights,
            facts.cpu,
        )
    )


def _counters(urls: Sequence[str]) -> dict[str, int]:
    """Each server's generation counter; a server without vLLM's counters (a router in front
    of replicas) is left out, and so is not checked."""
    counts = {}
    for url in urls:
        try:
            counts[url] = generation_tokens(url)
        except ServerUnavailable:
            continue
    return counts


def other_work(base_url: str, probe: Probe, before: dict[str, int]) -> str:
    """What else the servers counted in `before` generated while `probe` ran on `base_url`
    ("" if nothing): that server's tokens beyond the probe's own, any other's at all."""
    after = _counters(list(before))
    busy = []
    for url, was in before.items():
        extra = after.get(url, was) - was - (probe.tokens if url == base_url else 0)
        if extra > 0:
            busy.append(f"{url} generated {extra} tokens for other clients")
    return "; ".join(busy)


def measured_rates(
    facts: ServerFacts, streams: Sequence[int] = STREAMS, beside: Sequence[str] = ()
) -> list[StreamRate]:
    """The server's rates at `streams`, measured once per server facts and kept on disk,
    unless the server or one `beside` it (on the same host, so sharing its cores) worked for
    other clients meanwhile."""
    path = mur_home() / "throughput.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = f"{_key(facts)}|{','.join(map(str, streams))}"
    with FileLock(str(path) + ".lock"):
        known = json.loads(path.read_text()) if path.exists() else {}
        if key in known:
            return [StreamRate(int(width), float(rate)) for width, rate in known[key]]
        before = _counters([facts.base_url, *beside])
        probe = asyncio.run(measure(facts.base_url, facts.model, streams))
        rates = [StreamRate(r.streams, round(r.tokens_per_s, 2)) for r in probe.rates]
        busy = other_work(facts.base_url, probe, before)
        if busy:
            print(
                f"throughput of {facts.base_url} measured while {busy}: used for this run, "
                f"not kept in {path}",
                file=sys.stderr,
            )
        else:
            known[key] = [[rate.streams, rate.tokens_per_s] for rate in rates]
            path.write_text(json.dumps(known, indent=2) + "\n")
    return rates
