"""What `mur solve --dataset` (and `python run.py --dataset`) does with its plan: skip what the
folder already holds, run the rest (evals.harness), then write the folder's report
(evals.report)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from langchain_core.language_models import BaseChatModel

from mur.evals.harness.checkpoints import open_checkpoints
from mur.evals.harness.plan import EvaluationPlan
from mur.evals.harness.pool import WorkerPool, run_in_workers
from mur.evals.harness.provenance import (
    ROLES,
    choose_concurrency,
    record_servers,
    role_facts,
    servers_entry,
)
from mur.evals.harness.records import RecordStore, SettingsMismatchError
from mur.evals.harness.runner import RunOutcome, run_jobs
from mur.evals.harness.shutdown import STOPPED_EXIT
from mur.evals.report.tables import write_report
from mur.graphs.model_calls import server_roles
from mur.graphs.mur import build_graph
from mur.graphs.refine import STRATEGIES
from mur.servers.clients.errors import ServerUnavailable


def record_command(path: Path, command: str) -> None:
    """Append the command to the folder's command.txt unless it is already its last line: a
    folder may be filled by several commands (a gamma sweep after the main table), and a
    resumed run repeats its command."""
    lines = path.read_text().splitlines() if path.exists() else []
    if not lines or lines[-1] != command:
        with path.open("a") as fh:
            fh.write(command + "\n")


def servers_in_use(
    store: RecordStore, plan: EvaluationPlan, backbone: BaseChatModel, verifier: BaseChatModel
) -> int:
    """Record the servers' facts in settings.json (refusing a resume on servers whose tokens
    differ) and return the questions to keep in flight: the plan's, or measured."""
    facts = role_facts(backbone, verifier)
    if plan.concurrency is None:
        asked = ROLES if STRATEGIES[plan.strategy].uses_verifier else ("backbone",)
        concurrency, rates = choose_concurrency(facts, asked=asked)
        how = "measured" if rates else "default (no vLLM server to measure)"
    else:
        concurrency, rates, how = plan.concurrency, {}, "--concurrency"
    record_servers(
        store, servers_entry(facts, concurrency, rates, how), allow_mixed=plan.allow_mixed_servers
    )
    if rates:
        measured = "; ".join(
            f"{role} " + ", ".join(f"{r.streams}: {r.tokens_per_s:.0f}" for r in rs)
            for role, rs in rates.items()
        )
        print(f"throughput (streams: tok/s): {measured}; {concurrency} in flight", file=sys.stderr)
    return concurrency


def run_evaluation(
    plan: EvaluationPlan,
    backbone: BaseChatModel,
    verifier: BaseChatModel,
    *,
    prog: str = "mur solve",
    workers: WorkerPool | None = None,
) -> int:
    """Run a plan: skip what its folder already holds, run the rest, report. `prog`: the
    command that asked (`mur solve`, `run.py`), the first word of an error line; `workers`:
    run the questions in worker processes (`--workers N`, evals.harness.pool), else here."""
    out = plan.folder
    store = RecordStore(out)
    try:
        store.check_settings(plan.folder_settings(backbone, verifier))
        concurrency = servers_in_use(store, plan, backbone, verifier)
    except SettingsMismatchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except ServerUnavailable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    record_command(out / "command.txt", plan.command)
    jobs = plan.jobs()
    done = store.done_keys()
    todo = [job for job in jobs if job.key.text not in done]
    print(
        f"{len(plan.problems)} questions x {len(jobs) // max(len(plan.problems), 1)} settings = "
        f"{len(jobs)} runs; {len(jobs) - len(todo)} already in {store.folder}, {len(todo)} to go"
        + (
            f" (dropped {store.dropped_bytes} bytes of a cut-short last line)"
            if store.dropped_bytes
            else ""
        ),
        file=sys.stderr,
    )

    async def run_checkpointed() -> RunOutcome:
        async with open_checkpoints(out) as saver:
            graph = build_graph(backbone=backbone, verifier=verifier, checkpointer=saver)
            roles = server_roles(backbone, verifier)
            return await run_jobs(graph, todo, store, concurrency=concurrency, roles=roles)

    try:
        outcome = asyncio.run(
            run_in_workers(todo, store, concurrency=concurrency, pool=workers)
            if workers
            else run_checkpointed()
        )
    except KeyboardInterrupt:  # before the run's own signal handling was in place
        print(
            f"\ninterrupted: finished questions are saved in {store.folder}; rerun the same "
            "command to finish the rest",
            file=sys.stderr,
        )
        return STOPPED_EXIT
    return finish(outcome, store)


def finish(outcome: RunOutcome, store: RecordStore) -> int:
    """Say how the run ended and write the report unless it stopped short; the exit status."""
    if outcome.lost:  # its questions in flight wait for a rerun: no report yet
        print(
            f"{outcome.lost}; {outcome.finished} runs finished this time and are saved in "
            f"{store.folder}, {outcome.skipped} left: rerun the same command to finish the rest",
            file=sys.stderr,
        )
        return 1
    if outcome.stopped_by:
        print(
            f"stopped ({outcome.stopped_by}): {outcome.finished} runs finished this time and "
            f"are saved in {store.folder}, {outcome.skipped} left; rerun the same command to "
            "finish the rest",
            file=sys.stderr,
        )
        return STOPPED_EXIT
    if outcome.server_gone:
        print(
            f"the model server stopped answering ({outcome.server_gone}); "
            f"{outcome.finished} runs finished and are saved in {store.folder}. Start the server "
            "again and rerun the same command to finish the rest.",
            file=sys.stderr,
        )
        return 1
    if outcome.failed and not store.done_keys():  # no record yet: no table to write
        print(
            f"{outcome.failed} runs failed and none is recorded in {store.folder} yet (reasons "
            f"in {store.errors_path}); rerun the same command to retry them",
            file=sys.stderr,
        )
        return 1
    report = write_report(store.folder)
    print(report.markdown)
    print(f"records: {store.folder}\nreport: {report.markdown_path}", file=sys.stderr)
    if outcome.failed:
        print(
            f"{outcome.failed} runs failed (reasons in {store.errors_path}); rerun the same "
            "command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0
