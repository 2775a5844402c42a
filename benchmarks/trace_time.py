"""`mur bench trace_time`: how long a user waits for one answer under each trace rule or step
router.

Each question is solved alone (nothing else in flight on the server), once per arm (`ARMS`),
the arms' order rotating from question to question. A run whose completion tokens differ
from what the server's counter moved by meanwhile shared the server, or lost a request, and
is refused. Tokens and time differ from draw to draw; the arms' ratios to the first are what
compares. A rule that draws in batches waits for each batch's last trace before the next (a
branch waits for its parent): the seconds spent waiting so are that price.

With --out, each timed run is saved as it finishes, and the same command resumes where a
stopped one left off (refused on a server whose CPU, dtype or weights differ: no table mixes
two); --table prints the table of the runs it holds, without a server.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from mur.evals.harness.records import describe_differences
from mur.evals.harness.wall_time import Timed, paired, read
from mur.evals.report.traces import first_ids
from mur.experiments import cascade
from mur.experiments.parallel_traces import MUR_ESC
from mur.graphs.state import Context, output_of
from mur.servers.clients.metrics import generation_tokens, prompt_tokens, settled
from mur.servers.processes.facts import (
    ServerFacts,
    describe_recorded,
    token_differences,
)

TRACE_ARMS: dict[str, Mapping[str, Any]] = {
    "majority@8": {"traces": 8},
    "mur-esc": MUR_ESC,
    "MUR branching": {**MUR_ESC, "branch": "mur_max"},
    "EAGer branching": {**MUR_ESC, "branch": "eager"},
}
"""The trace rules (the default arms)."""
ARMS: dict[str, Mapping[str, Any]] = {
    **TRACE_ARMS,
    **{cascade.TIMED_PREFIX + name: settings for name, settings in cascade.TIMED_ARMS.items()},
}
"""Every arm's graph settings: the trace rules and the cascade's step routers (an arm with
`cascade.WRITER` has the verifier's server write)."""


def arm_settings(arm: str) -> dict[str, Any]:
    """The arm's graph settings, without which server writes."""
    return {k: v for k, v in ARMS[arm].items() if k != cascade.WRITER}


def writer(arm: str) -> str:
    """Whose server writes the arm's steps: "backbone", or "verifier" (the cascade's large
    arm: the external model alone)."""
    return str(ARMS[arm].get(cascade.WRITER, "backbone"))


def waiting(run: Timed) -> float:
    """Seconds a question spent with part of a round's traces done, waiting for its last: the
    traces start in rounds of the arm's batch (all at once without one), and a round after the
    first starts only once the last trace before it finished (a branch needs its parent)."""
    batch = ARMS[run.arm].get("trace_batch") or len(run.finished_s) or 1
    rounds = [run.finished_s[i : i + batch] for i in range(0, len(run.finished_s), batch)]
    return sum(max(times) - min(times) for times in rounds if times)


class NotAlone(RuntimeError):
    """A timed run did not have the server to itself."""


def quiet_count(urls: Sequence[str], when: str) -> int:
    """The servers' generated-token counters, summed, once each has stood still for a second;
    NotAlone when one keeps moving (another client is generating)."""
    total = 0
    for url in urls:
        try:
            total += settled(partial(generation_tokens, url), quiet=1.0)
        except TimeoutError:
            raise NotAlone(
                f"the server at {url} kept generating {when}: another client is using it. "
                "Time on a quiet server: the same command resumes"
            ) from None
    return total


async def solve_alone(
    graph: Any, arm: str, question: Any, settings: Mapping[str, Any], urls: Sequence[str]
) -> Timed:
    """Time one question under one arm on the servers at `urls` (every one the graph may ask);
    NotAlone when they generated other tokens than the run drew meanwhile (another client, or
    a request that failed)."""
    before = quiet_count(urls, f"before {question.id} {arm}")
    prompts = sum(prompt_tokens(url) for url in urls)
    finished: dict[int, float] = {}  # trace index -> seconds from the start
    final: dict[str, Any] = {}
    start = time.perf_counter()
    async for mode, chunk in graph.astream(
        {"question": question.question},
        context=Context(**{**settings, **arm_settings(arm)}),
        stream_mode=["updates", "values"],
    ):
        if mode == "values":
            final = chunk
        elif "trace" in chunk:  # a trace's update: its summary
            for summary in chunk["trace"]["drawn"]:
                finished[summary["index"]] = time.perf_counter() - start
    wall = time.perf_counter() - start
    output = output_of(final)
    server = quiet_count(urls, f"after {question.id} {arm}") - before
    usage = output["usage"]
    tokens = usage["backbone_tokens"] + usage["external_tokens"]
    if server != tokens:
        where = f"server at {urls[0]}" if len(urls) == 1 else f"servers at {', '.join(urls)}"
        raise NotAlone(
            f"{question.id} {arm}: the {where} generated {server} tokens while the "
            f"run drew {tokens} ({usage['failed_calls']} failed requests): another client "
            "shared it, or a request was lost; this run is not kept. Time on a quiet server: "
            "the same command resumes"
        )
    summaries = output["traces"]
    return Timed(
        arm=arm,
        problem_id=question.id,
        wall_s=wall,
        tokens=tokens,
        server_tokens=server,
        prompt_tokens=sum(prompt_tokens(url) for url in urls) - prompts,
        traces=len(summaries),
        branched=sum(1 for s in summaries if s.get("parent") is not None),
        finished_s=[finished[index] for index in sorted(finished)],
    )


async def warm_up(graph: Any, question: Any, settings: Mapping[str, Any]) -> None:
    """One untimed step, so the first timed run does not pay the first request's costs."""
    await graph.ainvoke(
        {"question": question.question}, context=Context(**{**settings, "max_steps": 1})
    )


def resume(
    out: Path | None,
    facts: ServerFacts,
    plan: Mapping[str, Any],
    verifier: ServerFacts | None = None,
) -> list[Timed]:
    """The runs an earlier --out holds ([] for none): ValueError naming the file when it is
    not such a result, was timed on another kind of server (or external model's server), or
    with other settings."""
    if out is None or not out.exists():
        return []
    document, runs = read(out)
    for role, given in (("server", facts), ("verifier", verifier)):
        check_server(out, role, document.get(role), given)
    recorded_plan, asked = flat_plan(document.get("plan") or {}), flat_plan(plan)
    differ = [
        k for k in recorded_plan.keys() | asked.keys() if recorded_plan.get(k) != asked.get(k)
    ]
    if differ:
        raise ValueError(
            f"{out} was timed with {describe_differences(differ, recorded_plan, asked)}: rerun "
            "with its flags, or give another --out"
        )
    return runs


def check_server(
    out: Path, role: str, recorded: dict[str, Any] | None, given: ServerFacts | None
) -> None:
    """ValueError unless the `role` server an --out file was timed on is of the same kind as
    the one given (its URL may differ), or neither has one."""
    if recorded is None and given is None:
        return
    if recorded is None or given is None:
        had, has = ("with", "without") if recorded is not None else ("without", "with")
        raise ValueError(
            f"{out} was timed {had} a {role} server and this run is {has} one: one table "
            "times one setup; give another --out"
        )
    differ = token_differences(recorded, given.as_json())
    differ += ["cpu"] * (recorded.get("cpu") != given.cpu)
    if differ:
        raise ValueError(
            f"{out} was timed on {describe_recorded(recorded)}, this {role} is "
            f"{given.describe()} ({', '.join(differ)} differ): one table times one kind of "
            "server; give another --out"
        )


def flat_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A plan's own fields and its graph settings side by side, each compared by name."""
    return {**{k: v for k, v in plan.items() if k != "settings"}, **plan.get("settings", {})}


def save(
    out: Path,
    facts: ServerFacts,
    plan: Mapping[str, Any],
    runs: Sequence[Timed],
    verifier: ServerFacts | None = None,
) -> None:
    """Every run so far, written whole and renamed into place (a kill leaves the last copy)."""
    document: dict[str, Any] = {"server": facts.as_json()}
    if verifier is not None:
        document["verifier"] = verifier.as_json()
    document |= {"plan": plan, "runs": [asdict(r) for r in runs]}
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    partial.replace(out)


def schedule(
    ids: Sequence[str], arms: Sequence[str], done: Sequence[Timed]
) -> list[tuple[str, str]]:
    """(question id, arm) still to time, in order: the arms' order rotates from question to
    question (the first arm of question i is arm i), so no arm always runs first."""
    timed = {(run.problem_id, run.arm) for run in done}
    return [
        (problem_id, arm)
        for i, problem_id in enumerate(ids)
        for arm in [*arms[i % len(arms) :], *arms[: i % len(arms)]]
        if (problem_id, arm) not in timed
    ]


def table(runs: Sequence[Timed], arms: Sequence[str]) -> str:
    """Per arm, on the questions every arm timed, with the ratios of its means to the first
    arm's."""
    kept = paired(runs, arms)
    left_out = sorted({r.problem_id for r in runs if r.arm in arms} - {r.problem_id for r in kept})
    runs = kept
    lines = [
        "| arm | questions | wall s / question | median | max | tokens / question | "
        "prompt tokens / question | server gen tok/s | traces | branched | waiting s / question | "
        "wall vs first | tokens vs first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: tuple[float, float] | None = None
    for arm in arms:
        mine = [r for r in runs if r.arm == arm]
        if not mine:
            continue
        walls = [r.wall_s for r in mine]
        wall, tokens = statistics.fmean(walls), statistics.fmean(r.tokens for r in mine)
        base = base or (wall, tokens)
        rate = sum(r.server_tokens for r in mine) / sum(walls)
        lines.append(
            f"| {arm} | {len(mine)} | {wall:.1f} | {statistics.median(walls):.1f} | "
            f"{max(walls):.1f} | {tokens:,.0f} | "
            f"{statistics.fmean(r.prompt_tokens for r in mine):,.0f} | {rate:.1f} | "
            f"{statistics.fmean(r.traces for r in mine):.2f} | "
            f"{statistics.fmean(r.branched for r in mine):.2f} | "
            f"{statistics.fmean(waiting(r) for r in mine):.1f} | {wall / base[0]:.2f}x | "
            f"{tokens / base[1]:.2f}x |"
        )
    if left_out:
        lines.append(f"\nLeft out, not timed by every arm yet: {first_ids(left_out)}")
    return "\n".join(lines)
