"""The measurements: graph runs recorded on the wire, their direct replays, the server's raw
batched throughput, and n-choice requests, all against one vLLM server in one event loop."""

from __future__ import annotations

import asyncio
import math
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import openai

from mur.benchmarks.analysis import step_of
from mur.benchmarks.counters import Counters, add_counters, parse_counters
from mur.benchmarks.recording import (
    QUESTION,
    RecordedRequest,
    Recorder,
    plan_waves,
    replay_bodies,
    replay_body,
)
from mur.benchmarks.results import GraphRun, NChoiceRun, RawRun, ReplayRun
from mur.graphs.mur import build_graph
from mur.graphs.state import Context, context_for
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.clients.probes import normalize_base_url, root_url

DEFAULT_STRATEGIES: tuple[str, ...] = ("best_of_n", "critic")
# Gate labels as the runner reads them (nodes.gate_labels): mur+bc = bias correction.
DEFAULT_GATES: tuple[str, ...] = ("mur", "mur+bc", "always", "never")
DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16)
# Small graph settings, so the whole benchmark runs in minutes on a 2-core CPU server.
SMALL_SETTINGS: dict[str, int] = {
    "max_steps": 6,
    "max_step_tokens": 96,
    "judge_max_tokens": 64,
    "thinking_budget": 64,
}


class Server:
    """The vLLM server under test: its root, model and counters."""

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = normalize_base_url(base_url)
        self.root = root_url(self.base_url)
        self.model = model
        self._http = httpx.AsyncClient(timeout=60)

    async def metrics_text(self, attempts: int = 3) -> str:
        """/metrics; retried, as a server starved of CPU can miss a beat (shared machines)."""
        for attempt in range(attempts):
            try:
                resp = await self._http.get(f"{self.root}/metrics")
                resp.raise_for_status()
                return resp.text
            except (httpx.TimeoutException, httpx.TransportError):
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(2.0 * (attempt + 1))
        raise AssertionError("unreachable")

    async def counters(self) -> Counters:
        return parse_counters(await self.metrics_text())

    async def idle(self, timeout: float = 60) -> None:
        """Wait until the server runs no request (aborted ones drain asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = await self.counters()
            if not c.requests_running and not c.requests_waiting:
                return
            await asyncio.sleep(0.2)

    async def aclose(self) -> None:
        await self._http.aclose()


@dataclass(frozen=True)
class Settings:
    """What the graph runs with, and the benchmark's own knobs."""

    questions: int = 8
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    gates: tuple[str, ...] = DEFAULT_GATES
    concurrency: int = 8
    levels: tuple[int, ...] = DEFAULT_LEVELS
    scaling_strategy: str = "critic"
    window_s: float = 20.0
    raw_seconds: float = 12.0
    gamma: float = 0.9
    graph: dict[str, int] = field(default_factory=lambda: dict(SMALL_SETTINGS))
    n_choice_reps: int = 4
    profile_graph: str | None = None

    def context(self, label: str, strategy: str = "critic") -> Context:
        """The run's Context for a gate label (`mur`, `mur+bc`, `random@0.2`, `always`, ...)
        and a strategy."""
        return context_for(label, {**self.graph, "strategy": strategy}, gamma=self.gamma)


class Bench:
    """Runs the four measurements against one server; everything in one event loop."""

    def __init__(self, server: Server, settings: Settings, problems: Sequence[Any]) -> None:
        self.server, self.settings, self.problems = server, settings, problems
        self.salt = secrets.token_hex(6)
        self.log: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)

    def _salt(self, label: str) -> str:
        """A prefix-cache space of its own for one run (vLLM refuses '/', '@', '\\')."""
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)
        return f"bench-{self.salt}-{safe}"[:128]

    async def run_graph(
        self,
        label: str,
        strategy: str,
        gate: str,
        concurrency: int,
        problems: Sequence[Any],
        *,
        window_s: float | None = None,
        per_request_counters: bool = False,
    ) -> GraphRun:
        """Run the graph on `problems`, `concurrency` at a time in their order, recording
        every request. With `window_s`, new questions start only during the first `window_s`
        seconds (the counters are read when it closes) and the run ends when those finish."""

        recorder = Recorder(self.server.counters if per_request_counters else None)
        model = make_chat_model(
            self.server.base_url,
            self.server.model,
            extra_body={"cache_salt": self._salt(label)},
            http_async_client=recorder.http_client(),
        )
        graph = build_graph(backbone=model, verifier=model)
        context = self.settings.context(gate, strategy)
        run = GraphRun(label, strategy, gate, concurrency, 0, window_s=window_s)
        results: list[dict[str, Any]] = []
        queue = list(enumerate(problems))[::-1]
        deadline = math.inf

        async def worker() -> None:
            while queue and time.perf_counter() < deadline:
                index, problem = queue.pop()
                run.questions += 1
                begin = time.perf_counter()
                QUESTION.set(index)
                try:
                    result = await graph.ainvoke(
                        {"question": problem.question, "system_prompt": problem.system_prompt},
                        context=context,
                    )
                except Exception as exc:  # recorded; the benchmark goes on
                    run.failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    continue
                run.spans[index] = (begin, time.perf_counter())
                results.append(result)

        async def close_window(start: Counters) -> None:
            await asyncio.sleep(window_s or 0)
            run.window = await self.server.counters() - start

        await self.server.idle()
        before = await self.server.counters()
        cpu0, t0 = time.process_time(), time.perf_counter()
        if window_s is not None:
            deadline = t0 + window_s
            window = asyncio.create_task(close_window(before))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.wall_s, run.cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        if window_s is not None:
            await window
        run.server = await self.server.counters() - before
        for result in results:
            usage = result["usage"]
            run.backbone_tokens += usage["backbone_tokens"]
            run.external_tokens += usage["external_tokens"]
            run.calls += usage["llm_calls"]
            for step in result["steps"]:
                scaled, total = run.scaled_by_step.get(step["index"], (0, 0))
                run.scaled_by_step[step["index"]] = (scaled + int(step["scaled"]), total + 1)
                run.steps_total += 1
                run.steps_scaled += int(step["scaled"])
        run.requests = recorder.requests()
        if run.failures and not results:
            raise RuntimeError(f"every question of {label} failed: {run.failures[0]}")
        self.log(
            f"  {label}: {len(results)}/{run.questions} questions, {run.total_tokens:,} tokens, "
            f"{run.calls} calls, {run.wall_s:.1f} s"
            + (f", {len(run.failures)} failed: {run.failures[0]}" if run.failures else "")
        )
        return run

    def _client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.server.base_url, api_key="EMPTY", max_retries=0, timeout=600
        )

    async def _send(self, client: Any, body: dict[str, Any]) -> Any:
        rest = {k: v for k, v in body.items() if k not in ("model", "messages")}
        return await client.chat.completions.create(
            model=body["model"], messages=body["messages"], extra_body=rest
        )

    async def replay(self, run: GraphRun) -> ReplayRun:
        """The graph's requests, question by question and wave by wave, at its concurrency."""
        plan = plan_waves(run.requests)
        salt = self._salt(f"{run.label}-replay")
        client = self._client()
        limit = asyncio.Semaphore(run.concurrency)

        async def question(waves: list[list[RecordedRequest]]) -> None:
            async with limit:
                for wave in waves:
                    bodies = [b for r in wave for b in replay_bodies(r, salt)]
                    await asyncio.gather(*(self._send(client, b) for b in bodies))

        await self.server.idle()
        before = await self.server.counters()
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(question(waves) for waves in plan))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        server = await self.server.counters() - before
        await client.close()
        self.log(f"  replay {run.label}: {len(run.requests)} requests, {wall:.1f} s")
        return ReplayRun(run.label, wall, cpu, server, len(run.requests))

    async def raw(
        self, requests: Sequence[RecordedRequest], concurrency: int, seconds: float, label: str
    ) -> RawRun:
        """The server's batched throughput on the graph's own request mix, `concurrency`
        streams for `seconds`. Each pass over the questions gets a fresh prefix-cache space,
        so prompts hit the cache as they did in the graph (a question's earlier steps only)."""
        chains = [[r for wave in waves for r in wave] for waves in plan_waves(requests)]
        client = self._client()
        pending: list[tuple[str, list[RecordedRequest]]] = []
        passes = done = 0

        async def stream() -> None:
            nonlocal passes, done
            while True:
                if not pending:
                    passes += 1
                    salt = self._salt(f"raw-{label}-{passes}")
                    pending.extend((salt, chain) for chain in reversed(chains))
                salt, chain = pending.pop()
                for request in chain:
                    bodies = replay_bodies(request, salt)
                    await asyncio.gather(*(self._send(client, b) for b in bodies))
                    done += 1

        await self.server.idle()
        before = await self.server.counters()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(stream()) for _ in range(concurrency)]
        await asyncio.sleep(seconds)
        after = await self.server.counters()
        elapsed = time.perf_counter() - t0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await self.server.idle()
        return RawRun(concurrency, elapsed, after - before, done)

    async def n_choices(self, run: GraphRun) -> list[NChoiceRun]:
        """N candidates for a step: one request with n = N vs N concurrent requests, each
        after the same warm-up draft (as in the graph, where the draft cached the prefix)."""
        n = self.settings.graph.get("num_candidates", 4)
        drafts = [r for r in run.requests if step_of(r.body) == 2][: self.settings.n_choice_reps]
        client = self._client()
        length = self.settings.graph["max_step_tokens"]
        totals: dict[str, NChoiceRun] = {}
        for rep, draft in enumerate(drafts):
            order = ("one request", "separate") if rep % 2 == 0 else ("separate", "one request")
            for kind in order:
                salt = self._salt(f"nchoice-{rep}-{kind.replace(' ', '-')}")
                warm = replace(draft, choice_tokens=(length,), completion_tokens=length)
                await self._send(client, replay_body(warm, salt))
                await self.server.idle()
                before = await self.server.counters()
                t0 = time.perf_counter()
                if kind == "one request":
                    body = {**replay_body(warm, salt), "n": n}
                    await self._send(client, body)
                else:
                    await asyncio.gather(
                        *(self._send(client, replay_body(warm, salt)) for _ in range(n))
                    )
                wall = time.perf_counter() - t0
                delta = await self.server.counters() - before
                label = f"{kind}: n={n}" if kind == "one request" else f"{n} requests, n=1"
                prev = totals.get(label)
                totals[label] = NChoiceRun(
                    label,
                    wall + (prev.wall_s if prev else 0.0),
                    add_counters(prev.server, delta) if prev else delta,
                )
        await client.close()
        return list(totals.values())
