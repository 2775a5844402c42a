"""`mur bench client`: the client's own CPU per generated token, against a server that answers
at once.

On a GPU the engine generates tokens a hundred times faster than the 2-core CPU server, and
what the client spends on each decides whether one process keeps the GPU busy. Here a
vLLM-shaped fake (testing/fake_vllm.py, its own process, its CPU counted apart) answers every
request at once, so all that is measured is the client, one arm (`ARMS`; the layers are
benchmarks/client_arm.py's) in a process of its own. `--vllm-profile NAME` measures the other
side instead: the CPU a real vLLM server's API process and engine spend per generated token.
`--before DIR` runs every arm over DIR's checkout too (`git worktree add DIR COMMIT`),
interleaved with this one's, so a change is measured side by side on one CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil

from mur.benchmarks.report import load_line, machine_line
from mur.benchmarks.tables import dict_table, fmt, markdown_table
from mur.servers import ServerError
from mur.servers.clients.metrics import generation_tokens, settled
from mur.servers.clients.probes import healthy
from mur.servers.processes.launcher import up

ARM_SCRIPT = Path(__file__).with_name("client_arm.py")
MODEL = "fake/vllm"


@dataclass(frozen=True)
class Arm:
    """One measured setting: a layer, the graph's settings, and how many questions."""

    name: str
    layer: str
    strategy: str = "critic"
    gate: str = "mur"
    top_logprobs: int = 0
    traces: int = 1
    workers: int = 1
    keyed: bool = False  # endpoint: each request carries an Idempotency-Key (checkpointed)
    both: bool = True  # also measured over the --before checkout
    context: dict[str, Any] = field(default_factory=dict)

    def solve_flags(self, questions: int, concurrency: int) -> list[str]:
        flags = ["--dataset", "math500", "--limit", str(questions), "--strategy", self.strategy]
        flags += ["--gate", self.gate, "--concurrency", str(concurrency)]
        if self.top_logprobs:
            flags += ["--top-logprobs", str(self.top_logprobs)]
        if self.workers > 1:
            flags += ["--workers", str(self.workers)]
        return flags


def _layers(top: int) -> list[Arm]:
    names = ("floor", "sdk", "langchain", "graph", "checkpoints", "cli")
    return [Arm(f"{layer} top{top}", layer, top_logprobs=top) for layer in names]


ARMS: tuple[Arm, ...] = (
    *_layers(0),
    *_layers(20),
    Arm("graph critic never top0", "graph", gate="never"),
    Arm("graph critic never top20", "graph", gate="never", top_logprobs=20),
    Arm("graph best_of_n mur top0", "graph", strategy="best_of_n"),
    Arm("graph 8 traces majority top0", "graph", traces=8, gate="never"),
    Arm("cli --workers 2 top0", "cli", workers=2, both=False),
    Arm("endpoint top0", "endpoint"),
    Arm("endpoint keyed top0", "endpoint", keyed=True),
    Arm("endpoint top20", "endpoint", top_logprobs=20),
)
ARM_NAMES = tuple(arm.name for arm in ARMS)


def chosen_arms(text: str) -> list[Arm]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ARM_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown arm {unknown[0]!r}: choose one of {', '.join(ARM_NAMES)}")
    return [arm for arm in ARMS if arm.name in names]


class FakeServer:
    """The fake vLLM server in its own process, for the whole benchmark."""

    def __init__(self, port: int) -> None:
        argv = [sys.executable, "-m", "mur.cli.fakes", "vllm", "--port", str(port)]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.process.stdout is not None
        first = self.process.stdout.readline().decode().strip()  # the port it listens on
        if not first.isdigit():
            err = self.process.stderr.read().decode() if self.process.stderr else ""
            raise RuntimeError(f"the fake server did not start: {err[-500:]}")
        self.root = f"http://127.0.0.1:{first}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if healthy(self.root, timeout=1):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the fake server did not answer at {self.root} within 60 s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def run_arm(arm: Arm, tree: Path, server: FakeServer, questions: int, concurrency: int) -> dict:
    """One arm over the checkout `tree`, in a process of its own."""
    asked = {
        **asdict(arm),
        "questions": questions,
        "concurrency": concurrency,
        "root": server.root,
        "model": MODEL,
        "steps": 8,
        "server_pid": server.process.pid,
        "cli": [
            *arm.solve_flags(questions + concurrency, concurrency),
            "--base-url",
            f"{server.root}/v1",
            "--model",
            MODEL,
        ],
    }
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(ARM_SCRIPT), json.dumps(asked)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"arm {arm.name} over {tree} failed: {done.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    counted = (result.get("counted_tokens"), result.get("counted_requests"))
    if counted != (None, None) and counted != (result["tokens"], result["requests"]):
        raise RuntimeError(
            f"arm {arm.name} over {tree}: the graph counted {counted[0]} tokens in "
            f"{counted[1]} requests, the server {result['tokens']:.0f} in "
            f"{result['requests']:.0f}: a request was lost or counted twice"
        )
    return result


def commit_of(tree: Path) -> str:
    """The checkout's short commit, with `+changes` when its files differ from it."""

    def git(*args: str) -> str:
        command = ["git", "-C", str(tree), *args]
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        "+changes" if git("status", "--porcelain") else ""
    )


def table(entries: Sequence[dict[str, Any]]) -> str:
    """One row per arm and checkout; a CPU time of 0 (under the clock's tick, on a fast machine
    or a short run) shows as '-'."""
    floors = {
        (e["checkout"], e["top_logprobs"]): e
        for e in entries
        if e["layer"] == "floor" and "failed" not in e
    }
    rows = []
    for e in entries:
        if "failed" in e:
            rows.append([e["arm"], e["checkout"], f"failed: {e['failed']}", *["-"] * 5])
            continue
        per_token = _per(1e6 * e["client_cpu_s"], e["tokens"])
        floor = floors.get((e["checkout"], e["top_logprobs"]))
        floor_per_token = _per(1e6 * floor["client_cpu_s"], floor["tokens"]) if floor else None
        times = _per(per_token, floor_per_token) if per_token and floor_per_token else None
        carried = _per(e["tokens"], e["client_cpu_s"])
        rows.append(
            [
                e["arm"],
                e["checkout"],
                fmt(per_token, 1),
                fmt(_per(1e3 * e["client_cpu_s"], e["requests"]), 2),
                fmt(None if carried is None else int(carried)),
                fmt(int(e["tokens"] / e["wall_s"])),
                fmt(_per(1e6 * e["server_cpu_s"], e["tokens"]), 1),
                "-" if times is None else f"{times:.1f}x",
            ]
        )
    headers = (
        "arm",
        "checkout",
        "client CPU us/token",
        "client CPU ms/request",
        "tokens/s one core carries",
        "tokens/s wall",
        "server CPU us/token",
        "x floor",
    )
    return markdown_table(headers, rows)


def _per(amount: float | None, count: float | None) -> float | None:
    """amount / count; None when either is missing or 0 (a CPU time under the clock's tick)."""
    return amount / count if amount and count else None


SERVER_SIDE_PROMPT = "Count from one to two hundred in words, one number a line."


def server_side(profile: str, requests: int, concurrency: int, prog: str) -> int:
    """A real vLLM server's own CPU per generated token at top_logprobs 0 and 20: its API
    process and its engine (the API process's children), over `requests` requests of 64
    tokens, `concurrency` at a time, after a warm-up."""
    try:
        server = up(profile, progress=True)
    except (KeyError, ValueError, ServerError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    if server.pid is None:
        print(f"{prog}: error: no process is recorded for {profile}", file=sys.stderr)
        return 1
    api = psutil.Process(server.pid)
    rows = []
    for top in (0, 20):
        asyncio.run(_requests(server.base_url, server.model, top, concurrency, concurrency))
        engine = api.children(recursive=True)
        counted = partial(generation_tokens, server.base_url)
        before = (_cpu([api]), _cpu(engine), settled(counted))
        asyncio.run(_requests(server.base_url, server.model, top, requests, concurrency))
        after = (_cpu([api]), _cpu(engine), settled(counted))
        api_s, engine_s, tokens = (b - a for a, b in zip(before, after, strict=True))
        rows.append(
            {
                "top_logprobs": top,
                "tokens": fmt(int(tokens)),
                "API process CPU us/token": fmt(1e6 * api_s / tokens, 1),
                "engine CPU us/token": fmt(1e6 * engine_s / tokens, 1),
                "API process CPU s": fmt(api_s, 2),
                "engine CPU s": fmt(engine_s, 2),
            }
        )
    print(f"{machine_line()}; load {load_line()}; {profile} at {server.base_url}\n")
    print(dict_table(rows))
    return 0


def _cpu(processes: Sequence[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


async def _requests(base_url: str, model: str, top: int, count: int, concurrency: int) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": SERVER_SIDE_PROMPT}],
        "max_tokens": 64,
        "ignore_eos": True,
        "logprobs": True,
        **({"top_logprobs": top} if top else {}),
    }
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one() -> None:
            async with limit:
                reply = await client.post(f"{base_url}/chat/completions", json=body)
                reply.raise_for_status()

        await asyncio.gather(*(one() for _ in range(count)))


def measured(
    arm: Arm, label: str, tree: Path, server: FakeServer, args: argparse.Namespace
) -> dict[str, Any]:
    """One arm's entry: its figures, or why it failed (the old client's connections time out
    under this load, for one)."""
    entry: dict[str, Any] = {
        "arm": arm.name,
        "checkout": f"{label} {commit_of(tree)}",
        "layer": arm.layer,
        "top_logprobs": arm.top_logprobs,
    }
    questions = args.questions // 2 if arm.top_logprobs else args.questions
    try:
        entry.update(run_arm(arm, tree, server, questions, args.concurrency))
    except RuntimeError as exc:
        entry["failed"] = str(exc).splitlines()[-1][:300]
        print(f"{arm.name} [{label}]: failed: {entry['failed']}", file=sys.stderr, flush=True)
        return entry
    per_token = fmt(_per(1e6 * entry["client_cpu_s"], entry["tokens"]), 0)
    print(f"{arm.name} [{label}]: {per_token} us/token", file=sys.stderr, flush=True)
    return entry


def save(path: Path, entry: dict[str, Any]) -> None:
    """Append `entry` to the JSON file at `path` (made if missing)."""
    old = json.loads(path.read_text())["entries"] if path.exists() else []
    document = {"machine": machine_line(), "entries": [*old, entry]}
    path.write_text(json.dumps(document, indent=1) + "\n")


def run(arms: Sequence[Arm], args: argparse.Namespace) -> int:
    """Every arm over this checkout and --before's, interleaved, each kept in --out as it
    ends (a crash loses one); the table. 0 when no arm failed."""
    here = Path(__file__).resolve().parents[1]
    trees = [("after", here)] + ([("before", args.before.resolve())] if args.before else [])
    server = FakeServer(args.port)
    entries: list[dict[str, Any]] = []
    try:
        for arm in arms:
            for label, tree in trees:
                if label == "before" and not arm.both:
                    continue
                entry = measured(arm, label, tree, server, args)
                entries.append(entry)
                if args.out is not None:
                    save(args.out, entry)
    finally:
        server.stop()
    print(f"{machine_line()}; load {load_line()}\n")
    print(table(entries))
    return 1 if any("failed" in entry for entry in entries) else 0
