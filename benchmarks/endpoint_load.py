"""Load test of the OpenAI-compatible endpoint: C concurrent clients send a fixed number of
requests, a share of them streamed, and every reply is checked. It passes only with zero lost,
zero duplicated and zero 5xx that were not injected; it prints latency p50/p99 and requests/s.

`fake`: the endpoint over the scripted backbone (testing/fake_endpoint.py): every reply's
content is known, and a share of requests carry an injected backbone fault; it measures the
endpoint's own HTTP, graph and streaming overhead. `cpu`: `mur endpoint` over the CPU vLLM
server (run it under flock /tmp/mur-integration.lock); the tokens the replies report must equal
what the server's counter says it generated. BENCHMARKS.md says what lost, duplicated and
wrong count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from mur.benchmarks.tables import dict_table
from mur.servers.clients.metrics import generation_tokens
from mur.servers.clients.probes import healthy
from mur.servers.processes.facts import cpu_model
from mur.testing.fake_endpoint import expected_content

ROOT = Path(__file__).resolve().parents[1]
CPU_BASE_URL = "http://127.0.0.1:8011/v1"
CPU_SETTINGS = {"max_steps": 2, "max_step_tokens": 16, "judge_max_tokens": 16}
MAX_THROTTLES = 50


@dataclass(frozen=True)
class Ask:
    """One planned request."""

    number: int
    model: str
    stream: bool
    fault_step: int | None  # the step whose backbone call fails (injected), None: no fault

    def question(self, backbone: str) -> str:
        if backbone == "cpu":
            return f"What is {self.number} + {self.number + 3}?"
        fault = f" [fault at step {self.fault_step}]" if self.fault_step else ""
        return f"Load request {self.number}: what is {self.number} + {self.number}?{fault}"

    def body(self, backbone: str) -> dict[str, Any]:
        """The request's JSON; over the cpu backbone, a small run (CPU_SETTINGS)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.question(backbone)}],
            "stream": self.stream,
        }
        if backbone == "cpu":
            body["mur"] = CPU_SETTINGS
        return body

    @property
    def expected(self) -> str:
        """The content of the scripted backbone's reply (testing/fake_endpoint.py)."""
        return expected_content(self.number, scaled=self.model == "mur-critic")


def planned(number: int, stream_share: float) -> Ask:
    """Request `number` without a fault: every k-th streamed, every other one on the
    gamma-gate (step 2 scaled), the rest on gate never."""
    stream_every = round(1 / stream_share) if stream_share > 0 else 0
    stream = stream_every > 0 and number % stream_every == 0
    model = "mur-critic" if number % 2 == 0 else "mur-critic-never"
    return Ask(number, model, stream, None)


def plan(requests: int, stream_share: float, fault_share: float) -> list[Ask]:
    """Requests spread evenly (planned), every m-th with a fault (fake only)."""
    fault_every = round(1 / fault_share) if fault_share > 0 else 0
    asks = []
    for number in range(requests):
        ask = planned(number, stream_share)
        if fault_every and number % fault_every == fault_every - 1:
            # A fault at step 2 of a stream comes after the first step was sent: an in-stream error.
            ask = replace(ask, fault_step=2 if ask.stream and number % 2 else 1)
        asks.append(ask)
    return asks


@dataclass(kw_only=True)
class Streamed:
    """What a 200 reply carried, read by the one reader both load generators use (chaos_load)."""

    ids: list[str] = field(default_factory=list)
    content: str = ""
    trace: dict[str, Any] | None = None
    error: str = ""
    done_events: int = 0
    step_indexes: list[int] = field(default_factory=list)
    first_step: float | None = None


@dataclass
class Outcome(Streamed):
    ask: Ask
    status: int = 0
    latency: float = 0.0
    throttled: int = 0


async def send(client: httpx.AsyncClient, url: str, ask: Ask, backbone: str) -> Outcome:
    """One request (retried after a 429's Retry-After), its reply read whole."""
    body = ask.body(backbone)
    outcome = Outcome(ask)
    start = time.perf_counter()
    try:
        while True:
            async with client.stream("POST", f"{url}/chat/completions", json=body) as reply:
                outcome.status = reply.status_code
                if reply.status_code == 429 and outcome.throttled < MAX_THROTTLES:
                    outcome.throttled += 1
                    await asyncio.sleep(float(reply.headers.get("retry-after", "1")))
                    continue
                if reply.status_code == 200:
                    await read_answer(reply, outcome, ask.stream, start)
                else:
                    outcome.error = json.loads(await reply.aread())["error"]["message"]
                break
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        outcome.status = 0
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.latency = time.perf_counter() - start
    return outcome


async def read_answer(reply: httpx.Response, into: Streamed, stream: bool, start: float) -> None:
    """Read a 200 reply whole: its JSON body, or its SSE stream (step chunks, the final chunk,
    [DONE]; or an error event); `start` times the first step."""
    if not stream:
        data = json.loads(await reply.aread())
        into.ids.append(data["id"])
        into.content = data["choices"][0]["message"]["content"]
        into.trace = data["mur"]
        return
    async for line in reply.aiter_lines():
        if not line.startswith("data: "):
            continue  # blank separators and pings
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            into.done_events += 1
            continue
        event = json.loads(data)
        if "error" in event:
            into.error = event["error"]["message"]
            continue
        into.ids.append(event["id"])
        for choice in event["choices"]:
            into.content += choice["delta"].get("content") or ""
        if "mur_step" in event:
            into.first_step = into.first_step or time.perf_counter() - start
            into.step_indexes.append(event["mur_step"]["index"])
        if "mur" in event:
            into.trace = event["mur"]


def problems_of(outcome: Outcome, backbone: str) -> list[str]:
    """What is wrong with one reply, given what was asked."""
    ask, found = outcome.ask, []
    if outcome.status == 0:
        return [f"lost: {outcome.error}"]
    injected = ask.fault_step is not None
    if injected and (not ask.stream or ask.fault_step == 1):
        if outcome.status != 502 or "injected fault" not in outcome.error:
            found.append(f"expected the injected 502, got {outcome.status} {outcome.error!r}")
        return found
    if outcome.status != 200:
        return [f"HTTP {outcome.status}: {outcome.error}"]
    if ask.stream and len(set(outcome.ids)) != 1:
        found.append(f"{len(set(outcome.ids))} ids in one stream")
    if injected:  # a fault after the first step: the error in the stream, no [DONE]
        if "injected fault" not in outcome.error or outcome.done_events:
            found.append(f"expected an in-stream injected error, got {outcome.error!r}")
        if outcome.step_indexes != [1]:
            found.append(f"steps streamed before the fault: {outcome.step_indexes}")
        return found
    if outcome.error or outcome.trace is None:
        return [f"no complete reply: {outcome.error or 'no trace'}"]
    steps = outcome.trace["steps"]
    lines = "".join(f"Step{s['index']}: {s['text']}\n" for s in steps)
    fallback = outcome.trace.get("fallback")
    if outcome.content != lines + (fallback["text"] if fallback else ""):
        found.append("content differs from the trace's steps")
    if [s["index"] for s in steps] != list(range(1, len(steps) + 1)):
        found.append(f"step indexes {[s['index'] for s in steps]}")
    if ask.stream:
        if outcome.done_events != 1:
            found.append(f"{outcome.done_events} [DONE] events")
        if outcome.step_indexes != [s["index"] for s in steps]:
            found.append(f"streamed steps {outcome.step_indexes}, kept {len(steps)}")
    if backbone == "fake" and outcome.content != ask.expected:
        found.append(f"content {outcome.content[:60]!r} is not request {ask.number}'s")
    return found


@dataclass
class Report:
    backbone: str
    clients: int
    requests: int
    streamed: int
    injected: int
    ok: int
    lost: int
    duplicated: int
    unexpected_5xx: int
    wrong: int
    throttled: int
    wall_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    stream_first_step_p50_ms: float | None
    reply_tokens: int
    server_tokens: int | None
    problems: list[str]

    @property
    def passed(self) -> bool:
        tokens_agree = self.server_tokens is None or self.server_tokens == self.reply_tokens
        failures = self.lost + self.duplicated + self.unexpected_5xx + self.wrong
        return failures == 0 and tokens_agree


async def load(url: str, asks: list[Ask], clients: int, backbone: str) -> tuple[list, float]:
    """Send every request with `clients` concurrent clients; (outcomes, wall seconds)."""
    pending = iter(asks)
    outcomes: list[Outcome] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        for ask in pending:  # shared: each client takes the next request not yet taken
            outcomes.append(await send(client, url, ask, backbone))

    timeout = httpx.Timeout(600, connect=30)
    return outcomes, await run_clients(clients, client_loop, clients, timeout)


async def run_clients(
    clients: int,
    client_loop: Callable[[httpx.AsyncClient], Awaitable[None]],
    connections: int,
    timeout: httpx.Timeout,
) -> float:
    """Run `clients` concurrent copies of `client_loop` over one pool of `connections`; the wall
    seconds they took."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return time.perf_counter() - start


def summarize(
    backbone: str, clients: int, outcomes: list[Outcome], wall: float, server_tokens: int | None
) -> Report:
    problems: list[str] = []
    seen_ids: set[str] = set()
    duplicated = lost = unexpected_5xx = wrong = 0
    for outcome in sorted(outcomes, key=lambda o: o.ask.number):
        ids = set(outcome.ids)
        if ids & seen_ids or len(outcome.step_indexes) != len(set(outcome.step_indexes)):
            duplicated += 1
            problems.append(f"request {outcome.ask.number}: duplicated id or step")
        seen_ids |= ids
        found = problems_of(outcome, backbone)
        if found and outcome.status == 0:
            lost += 1
        elif found and outcome.status >= 500:
            unexpected_5xx += 1
        elif found:
            wrong += 1
        problems += [f"request {outcome.ask.number}: {p}" for p in found]
    fine = [o for o in outcomes if o.status == 200 and o.trace is not None]
    latencies = np.array([o.latency for o in fine]) * 1000
    first_steps = [o.first_step * 1000 for o in fine if o.first_step is not None]
    usages = [o.trace["usage"] for o in fine if o.trace is not None]  # every one of `fine`
    reply_tokens = sum(u["backbone_tokens"] + u["external_tokens"] for u in usages)
    return Report(
        backbone=backbone,
        clients=clients,
        requests=len(outcomes),
        streamed=sum(o.ask.stream for o in outcomes),
        injected=sum(o.ask.fault_step is not None for o in outcomes),
        ok=len(fine),
        lost=lost,
        duplicated=duplicated,
        unexpected_5xx=unexpected_5xx,
        wrong=wrong,
        throttled=sum(o.throttled for o in outcomes),
        wall_s=round(wall, 2),
        requests_per_s=round(len(outcomes) / wall, 1),
        p50_ms=round(float(np.percentile(latencies, 50)), 1) if len(fine) else float("nan"),
        p99_ms=round(float(np.percentile(latencies, 99)), 1) if len(fine) else float("nan"),
        stream_first_step_p50_ms=round(float(np.median(first_steps)), 1) if first_steps else None,
        reply_tokens=reply_tokens,
        server_tokens=server_tokens,
        problems=problems,
    )


@contextmanager
def serving(command: list[str], port: int, log_path: Path, timeout: float = 300) -> Iterator[str]:
    """Run an endpoint process listening on `port`; yields its base URL once /health answers."""
    root = f"http://127.0.0.1:{port}"
    if healthy(root, timeout=1):
        raise RuntimeError(f"something already answers on {root}: pass another --port")
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while not healthy(root, timeout=1):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text().splitlines()[-20:])
                raise RuntimeError(f"{' '.join(command)} did not start on {root}:\n{tail}")
            time.sleep(0.2)
        yield f"{root}/v1"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(args: argparse.Namespace, server_flags: Sequence[str] = ()) -> Report:
    """Start the endpoint for `args.backbone` (`server_flags`: the connection flags the `cpu`
    backbone's endpoint is given), send the load, check every reply."""
    asks = plan(
        args.requests, args.stream_share, args.fault_share if args.backbone == "fake" else 0
    )
    max_runs = str(args.max_runs or args.clients)
    if args.backbone == "fake":
        command = [sys.executable, "-m", "mur.cli.fakes", "endpoint", "--max-runs", max_runs]
    else:
        command = [sys.executable, "-m", "mur.cli.endpoint", *server_flags]
        command += ["--max-runs", max_runs, "--log-level", "warning"]
    command += ["--port", str(args.port)]
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "endpoint.log"
        with serving(command, args.port, log) as url:
            before = generation_tokens(args.base_url) if args.backbone == "cpu" else None
            outcomes, wall = asyncio.run(load(url, asks, args.clients, args.backbone))
            server = generation_tokens(args.base_url) - before if before is not None else None
        report = summarize(args.backbone, args.clients, outcomes, wall, server)
        if not report.passed:  # what the endpoint said, to find out why
            report.problems += [f"endpoint log: {line}" for line in log.read_text().splitlines()]
    return report


def table_row(report: Report) -> dict[str, Any]:
    first = report.stream_first_step_p50_ms
    return {
        "backbone": report.backbone,
        "clients": report.clients,
        "requests": report.requests,
        "streamed": report.streamed,
        "injected faults": report.injected,
        "ok": report.ok,
        "lost": report.lost,
        "duplicated": report.duplicated,
        "5xx not injected": report.unexpected_5xx,
        "wrong": report.wrong,
        "429 retried": report.throttled,
        "p50 ms": report.p50_ms,
        "p99 ms": report.p99_ms,
        "first step p50 ms (stream)": "-" if first is None else first,
        "req/s": report.requests_per_s,
    }


def print_report(report: Report, as_json: bool) -> None:
    """The report as one JSON line, or the CPU, the table, the token counts and the problems
    (the first 20 and the last 40)."""
    if as_json:
        print(json.dumps(asdict(report)))
        return
    print(f"CPU: {cpu_model()} x {os.cpu_count()}")
    print(dict_table([table_row(report)]))
    if report.server_tokens is not None:
        print(f"tokens: replies {report.reply_tokens}, server counter {report.server_tokens}")
    for problem in report.problems[:20] + report.problems[-40:] * (len(report.problems) > 20):
        print(f"  {problem}")
