"""One arm of `mur bench client` (benchmarks/client_cost.py), run in a process of its own with
PYTHONPATH naming the checkout to measure, so the same file times the working tree and an older
checkout side by side: it uses only names every version has (`make_chat_model`, `build_graph`,
`Context`, `generate`, `open_checkpoints`) and imports nothing else of the project. It prints
one JSON object: the client's and the fake server's CPU seconds, wall seconds, and the requests
and generated tokens the server counted, over the timed part (after a warm-up).

Layers, each the one before it plus one more thing, on the same requests:
  floor      aiohttp + orjson + the mean logprob: what any client must do;
  sdk        the openai SDK's typed reply;
  langchain  the project's chat model and its reply reader (nodes.llm.generate);
  graph      the MUR graph (`build_graph` + `ainvoke`), as an app that embeds it runs it;
  checkpoints  the graph with the run folder's SQLite checkpoints (evals.harness.checkpoints);
  cli        `mur solve --dataset`, as a user runs it (its CPU sampled while it runs);
  endpoint   `mur endpoint` in a process of its own (one replica), sent the same questions
             as chat completions by an aiohttp client whose CPU is not counted; with
             `keyed`, each carries an Idempotency-Key, so its run is checkpointed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

QUESTION = "Question {i}: what is 6 times 7?"
INSTRUCTION = (
    "\nAlways end your solution with the phrase 'the answer is' followed by your final answer. "
    "Start your solution with 'Step1:'"
)
JUDGE = "You are a teacher. [Math Problem]\n{q}\n[Solution]\n{s}\n<paragraph_{k}>\n{p}\n"
JUDGE_END = ["</output>"]
REVISE = "Your previous solution is incorrect. The step has an error. Please revise your solution."


def counters(root: str) -> tuple[float, float]:
    """(requests, generated tokens) the server has answered."""
    with urllib_open(f"{root}/metrics") as reply:
        text = reply.read().decode()
    tokens = float(re.search(r"generation_tokens_total\{[^}]*\} (\S+)", text).group(1))  # type: ignore[union-attr]
    requests = float(re.search(r"request_success_total\{[^}]*\} (\S+)", text).group(1))  # type: ignore[union-attr]
    return requests, tokens


def urllib_open(url: str) -> Any:
    import urllib.request  # noqa: PLC0415  # only for the counters, read outside the timing

    return urllib.request.urlopen(url, timeout=10)


def cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


class TreeCPU:
    """A process's CPU with its children's, each child at the last value seen: a worker that
    ended between two samples still counts (up to its last sample)."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.seen: dict[int, float] = {}

    def __call__(self) -> float:
        for child in self.process.children(recursive=True):
            try:
                self.seen[child.pid] = cpu(child)
            except psutil.NoSuchProcess:
                continue
        return cpu(self.process) + sum(self.seen.values())


def steps_of(arm: dict[str, Any]) -> list[dict[str, Any]]:
    """The requests of one critic/mur question as the graph makes them on the fake server:
    eight steps, the third and sixth scaled: judged wrong, then revised."""
    top = arm["top_logprobs"]
    sampling = {"temperature": 0.6, "top_p": 0.8, "presence_penalty": 1.5, "top_k": 20}
    base = {"model": arm["model"], "logprobs": True, "stream": False, **sampling}
    bodies: list[dict[str, Any]] = []
    user = {"role": "user", "content": QUESTION + INSTRUCTION}
    solution = ""
    for k in range(1, arm["steps"] + 1):
        prefix = f"{solution}\nStep{k}:" if solution else f"Step{k}:"
        step = {
            **base,
            "messages": [user, {"role": "assistant", "content": prefix}],
            "max_completion_tokens": 2048,
            "stop": ["\nStep", f"Step{k + 1}:"],
            "continue_final_message": True,
            "add_generation_prompt": False,
            "chat_template_kwargs": {"enable_thinking": False},
            **({"top_logprobs": top} if top else {}),
        }
        bodies.append(step)
        if arm["gate"] == "mur" and k in (3, 6):
            judge = {**base, "max_completion_tokens": 1024, "top_logprobs": 5, "stop": JUDGE_END}
            content = JUDGE.format(q=QUESTION, s=solution, k=k, p="the step")
            bodies.append({**judge, "messages": [{"role": "user", "content": content}]})
            feedback = {"role": "user", "content": REVISE}
            revision = [user, {"role": "assistant", "content": solution}, feedback]
            last = {"role": "assistant", "content": prefix}
            bodies.append({**step, "messages": [*revision, last]})
        solution = f"{prefix} " + "we find the value of x " * 12
    return bodies


async def floor_question(session: aiohttp.ClientSession, url: str, arm: dict[str, Any]) -> None:
    for body in steps_of(arm):
        async with session.post(url, data=orjson.dumps(body)) as reply:
            data = orjson.loads(await reply.read())
        for choice in data["choices"]:
            entries = choice["logprobs"]["content"]
            _ = -sum(entry["logprob"] for entry in entries) / max(len(entries), 1)


async def sdk_question(client: Any, arm: dict[str, Any]) -> None:
    for body in steps_of(arm):
        extra = {k: body.pop(k) for k in list(body) if k in EXTRA_FIELDS}
        reply = await client.chat.completions.create(**body, extra_body=extra)
        for choice in reply.choices:
            entries = choice.logprobs.content
            _ = -sum(entry.logprob for entry in entries) / max(len(entries), 1)


EXTRA_FIELDS = ("top_k", "continue_final_message", "add_generation_prompt", "chat_template_kwargs")


async def langchain_question(model: Any, arm: dict[str, Any]) -> None:
    from langchain_core.messages import convert_to_messages  # noqa: PLC0415  # the tree's

    from mur.nodes.llm import Request, generate  # noqa: PLC0415  # the tree's

    for body in steps_of(arm):
        extra = {k: body[k] for k in EXTRA_FIELDS if k in body and k != "top_k"}
        request = Request(
            messages=convert_to_messages(body["messages"]),
            max_tokens=body["max_completion_tokens"],
            stop=body.get("stop"),
            continue_final_message=bool(body.get("continue_final_message")),
            top_logprobs=body.get("top_logprobs"),
            extra_body=extra,
        )
        await generate(model, request)


async def timed(
    arm: dict[str, Any],
    one: Callable[[int], Awaitable[None]],
    server: psutil.Process,
    client: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Warm up with `concurrency` questions, then time `questions` more; the client's CPU is
    this process's unless `client` reads another's."""
    client = client or partial(cpu, psutil.Process())
    limit = asyncio.Semaphore(arm["concurrency"])

    async def bounded(i: int) -> None:
        async with limit:
            await one(i)

    await asyncio.gather(*(bounded(i) for i in range(arm["concurrency"])))
    COUNTED.clear()
    before = (client(), cpu(server), time.perf_counter(), *counters(arm["root"]))
    await asyncio.gather(*(bounded(i) for i in range(arm["questions"])))
    after = (client(), cpu(server), time.perf_counter(), *counters(arm["root"]))
    names = ("client_cpu_s", "server_cpu_s", "wall_s", "requests", "tokens")
    result = {name: b - a for name, a, b in zip(names, before, after, strict=True)}
    if COUNTED:  # what the graph counted, to hold against the server's counters
        result["counted_tokens"] = sum(tokens for tokens, _ in COUNTED)
        result["counted_requests"] = sum(calls for _, calls in COUNTED)
    return result


COUNTED: list[tuple[int, int]] = []
"""(generated tokens, requests) of each timed question, as the graph's usage counts them."""


async def in_process(arm: dict[str, Any], server: psutil.Process) -> dict[str, Any]:
    url = f"{arm['root']}/v1/chat/completions"
    layer = arm["layer"]
    if layer == "floor":
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return await timed(arm, lambda i: floor_question(session, url, arm), server)
    if layer == "sdk":
        import openai  # noqa: PLC0415

        # Idle connections dropped after 2 s, before the server's 5 s (vLLM's, and uvicorn's
        # default) closes them: a stock client whose loop is busy for longer reuses one the
        # server is closing, and the request is lost as a reset.
        http = httpx_of(openai)
        limits = http.Limits(max_connections=1000, keepalive_expiry=2.0)
        client = openai.AsyncOpenAI(
            base_url=f"{arm['root']}/v1",
            api_key="EMPTY",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(limits=limits),
        )
        return await timed(arm, lambda i: sdk_question(client, arm), server)
    from mur.servers.clients.chat_models import make_chat_model  # noqa: PLC0415  # the tree's

    model = make_chat_model(f"{arm['root']}/v1", arm["model"])
    tune = _collector_tuning()
    if layer == "langchain":
        tune()
        return await timed(arm, lambda i: langchain_question(model, arm), server)
    return await graph_arm(arm, model, server, tune)


def httpx_of(openai: Any) -> Any:
    """The SDK's HTTP library (httpx, or httpx2 in newer SDKs): servers.clients.http_pool's
    `sdk_http_module`, which an older checkout has not."""
    import importlib  # noqa: PLC0415

    base = next(c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(base.__module__.split(".")[0])


def _collector_tuning() -> Callable[[], None]:
    """The tree's collector tuning, as its runner applies it (a no-op for a tree without)."""
    try:
        from mur.servers.clients.collector import tune_collector  # noqa: PLC0415
    except ImportError:
        return lambda: None
    return tune_collector


async def graph_arm(
    arm: dict[str, Any], model: Any, server: psutil.Process, tune: Callable[[], None]
) -> dict[str, Any]:
    from mur.evals.harness.checkpoints import open_checkpoints  # noqa: PLC0415  # the tree's
    from mur.graphs.mur import build_graph  # noqa: PLC0415
    from mur.graphs.state import Context  # noqa: PLC0415

    settings = {k: arm[k] for k in ("strategy", "gate", "top_logprobs", "traces")}
    context = Context(**settings, **arm.get("context", {}))
    saved = arm["layer"] == "checkpoints"
    with tempfile.TemporaryDirectory() as folder:
        async with open_checkpoints(Path(folder)) if saved else contextlib.nullcontext() as saver:
            graph = build_graph(backbone=model, verifier=model, checkpointer=saver)
            tune()
            return await timed(arm, _graph_question(graph, context, saved), server)


def _graph_question(graph: Any, context: Any, threads: bool) -> Callable[[int], Awaitable[None]]:
    async def one(i: int) -> None:
        config = {"configurable": {"thread_id": f"q{i}-{time.monotonic_ns()}"}} if threads else {}
        output = await graph.ainvoke(
            {"question": QUESTION.format(i=i)}, config=config, context=context
        )
        usage = output["usage"]
        tokens = usage["backbone_tokens"] + usage["external_tokens"]
        COUNTED.append((tokens, usage["llm_calls"]))

    return one


def cli_arm(arm: dict[str, Any], server: psutil.Process) -> dict[str, Any]:
    """`mur solve --dataset` in a process of its own, sampled every 0.1 s: the timed part runs
    from the sample after a fifth of its requests to the first that sees them all."""
    samples: list[tuple[float, float, float, float, float]] = []
    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable, "-m", "mur", "solve", *arm["cli"], "--out", folder]
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        watched = TreeCPU(psutil.Process(child.pid))
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                try:
                    samples.append(
                        (watched(), cpu(server), time.perf_counter(), *counters(arm["root"]))
                    )
                except psutil.NoSuchProcess:
                    return
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = child.communicate()
        done.set()
        sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"mur solve failed ({child.returncode}): {err.decode()[-2000:]}")
    first, final = samples[0][3], samples[-1][3]  # the server counts every arm's requests
    start = next(s for s in samples if s[3] - first >= (final - first) / 5)
    end = next(s for s in samples if s[3] >= final)
    names = ("client_cpu_s", "server_cpu_s", "wall_s", "requests", "tokens")
    return {name: b - a for name, a, b in zip(names, start, end, strict=True)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def endpoint_arm(arm: dict[str, Any], server: psutil.Process) -> dict[str, Any]:
    """`mur endpoint` over the fake server, its process's CPU counted as the client's."""
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable, "-m", "mur", "endpoint", "--port", str(port), "--max-runs"]
        argv += [str(10 * arm["concurrency"]), "--log-level", "warning"]
        argv += ["--base-url", f"{arm['root']}/v1", "--model", arm["model"]]
        argv += ["--checkpointer", str(Path(folder) / "checkpoints.sqlite")]
        log = open(Path(folder) / "endpoint.log", "wb")  # noqa: SIM115  # closed below
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            root = f"http://127.0.0.1:{port}"
            wait_for(root, child, Path(folder) / "endpoint.log")
            return asyncio.run(
                _endpoint_load(arm, root, TreeCPU(psutil.Process(child.pid)), server)
            )
        finally:
            child.terminate()
            child.wait(timeout=60)
            log.close()


def wait_for(root: str, child: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"mur endpoint exited ({child.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib_open(f"{root}/health") as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"mur endpoint did not answer at {root} within 120 s")


async def _endpoint_load(
    arm: dict[str, Any], root: str, endpoint: TreeCPU, server: psutil.Process
) -> dict[str, Any]:
    url = f"{root}/v1/chat/completions"
    model = "mur-critic" if arm["gate"] == "mur" else f"mur-critic-{arm['gate']}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            question = {"role": "user", "content": QUESTION.format(i=i)}
            body = {"model": model, "messages": [question], "mur": {}}
            if arm["top_logprobs"]:
                body["mur"] = {"top_logprobs": arm["top_logprobs"]}
            headers = {"Content-Type": "application/json"}
            if arm["keyed"]:
                headers["Idempotency-Key"] = f"q{i}-{time.monotonic_ns()}"
            async with session.post(url, data=orjson.dumps(body), headers=headers) as reply:
                data = orjson.loads(await reply.read())
                if reply.status != 200:
                    raise SystemExit(f"mur endpoint answered {reply.status}: {data}")
            usage = data["usage"]
            COUNTED.append((usage["completion_tokens"], data["mur"]["usage"]["llm_calls"]))

        return await timed(arm, one, server, endpoint)


def main() -> None:
    arm = json.loads(sys.argv[1])
    server = psutil.Process(arm["server_pid"])
    if arm["layer"] == "cli":
        result = cli_arm(arm, server)
    elif arm["layer"] == "endpoint":
        result = endpoint_arm(arm, server)
    else:
        result = asyncio.run(in_process(arm, server))
    print(json.dumps({**result, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
