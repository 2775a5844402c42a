"""`mur experiment bfcl`: BFCL's multi-turn cases, each run by an agent with MURMiddleware.

A `create_agent` agent (experiments.bfcl) works through each case's turns; one record per case
in a resumable folder.

    mur experiment bfcl --category multi_turn_base --limit 30 --gate never \\
        --profile cpu-qwen-0.5b --verifier-profile cpu-qwen-1.5b --out results/bfcl-pilot-small

The agent's model is the backbone's server, the stronger model that rewrites flagged calls the
verifier's; both decode greedily by default (BFCL's temperature is 0.001).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from mur.cli.args import OneLineParser, comma_choices, positive_int
from mur.cli.connection import add_connection_arguments, connection_options
from mur.cli.flags import SWEEPS, add_context_flags
from mur.evals.harness.records import RecordStore, SettingsMismatchError
from mur.evals.harness.run_record import JobKey
from mur.evals.harness.runner import GiveUpRule
from mur.experiments import bfcl
from mur.graphs.model_calls import describe_failure
from mur.graphs.state import Context, ContextError, context_for
from mur.integrations.middleware import GATE_SETTINGS, MURMiddleware
from mur.nodes.gate_labels import reads_gamma
from mur.servers.clients.errors import ServerError
from mur.servers.connect import connect

PROG = "mur experiment bfcl"
STRATEGY = "escalate"
"""The records' strategy: a flagged call is escalated to the stronger model, as MUR's escalate
strategy escalates a step."""


def parser_for(prog: str) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Run BFCL's multi-turn cases by a LangChain agent whose model calls "
        "MURMiddleware gates: flagged calls are rewritten by the stronger model.",
    )
    parser.add_argument(
        "--category",
        type=comma_choices(bfcl.CATEGORIES, "category"),
        default=bfcl.CATEGORIES[:1],
        help=f"BFCL's categories, a comma list of {', '.join(bfcl.CATEGORIES)} (default "
        f"{bfcl.CATEGORIES[0]})",
    )
    parser.add_argument(
        "--offset", type=int, default=0, help="skip this many cases of each (default 0)"
    )
    parser.add_argument("--limit", type=positive_int, help="cases of each to run (default: all)")
    parser.add_argument("--out", type=Path, required=True, help="the results folder (resumable)")
    parser.add_argument(
        "--concurrency", type=positive_int, default=4, help="cases in flight (default 4)"
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, default=512, help="a model call's limit (default 512)"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="both models' (default 0: greedy)"
    )
    add_connection_arguments(
        parser,
        defaults="The agent's model is the backbone's server, the stronger model the "
        "verifier's; unset, the environment's, else the embedded CPU servers (started).",
    )
    add_context_flags(parser, only=GATE_SETTINGS)
    return parser


def gate_context(args: argparse.Namespace) -> tuple[str, Context]:
    """The one gate label asked for and its Context (the middleware checks it as MUR does)."""
    labels = args.gate or [Context.model_fields["gate"].default]
    gammas = args.gamma or [Context.model_fields["gamma"].default]
    if len(labels) > 1 or len(gammas) > 1:
        raise ValueError("give one --gate and one --gamma: a folder holds one setting")
    given = {
        name: getattr(args, name)
        for name in GATE_SETTINGS
        if name not in SWEEPS and getattr(args, name) is not None
    }
    return labels[0], context_for(labels[0], given, gamma=gammas[0])


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run the cases not yet in --out and print a line for each; 0 when none failed."""
    args = parser_for(prog).parse_args(argv)
    try:
        label, context = gate_context(args)
        cases = [
            case
            for category in args.category
            for case in bfcl.load_cases(category, args.offset, args.limit)
        ]
    except (ValueError, ContextError, bfcl.BFCLMissingError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        servers = connect(**connection_options(args), start=True, progress=True)
    except ServerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    agent_model, stronger = (
        chat(client, args) for client in (servers.backbone, servers.verifier or servers.backbone)
    )
    gated = {name: getattr(context, name) for name in GATE_SETTINGS}  # the gate's family
    middleware = MURMiddleware(escalate_to=stronger, momentum_scope="thread", **gated)
    gamma = context.gamma if reads_gamma(label) else None
    settings = {
        "categories": list(args.category),
        "gate": label,
        "gamma": gamma,
        "alpha": context.alpha,
        "agent_model": str(agent_model.model_name),
        "stronger_model": str(stronger.model_name),
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "momentum_scope": "thread",
        "bfcl": bfcl.BFCL_REQUIREMENT,
    }
    store = RecordStore(args.out)
    try:
        store.check_settings(settings)
    except SettingsMismatchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    command = f"{prog} {shlex.join(sys.argv[1:] if argv is None else argv)}\n"
    (args.out / "command.txt").write_text(command)
    keys = {case.id: JobKey(bfcl.DATASET, case.id, STRATEGY, label, gamma, 0) for case in cases}
    done = store.done_keys()  # read once: each call loads the folder's records
    todo = [case for case in cases if keys[case.id].text not in done]
    print(f"{len(cases)} cases, {len(cases) - len(todo)} already in {args.out}, {len(todo)} to go")
    run = Run(store, middleware, agent_model, {**settings, **gated}, keys, args.concurrency)
    try:
        failed = asyncio.run(run.all(todo))
    except KeyboardInterrupt:  # each finished case is in the folder already
        print(f"{prog}: stopped (Ctrl-C): the cases in flight are not kept; the same command "
              "resumes", file=sys.stderr)  # fmt: skip
        return 130
    return 1 if failed else 0


def chat(client: Any, args: argparse.Namespace) -> ChatOpenAI:
    """A plain ChatOpenAI on a connection's server: the agent's messages, tools and tool calls
    as LangChain sends and parses them (the middleware asks it for logprobs)."""
    return ChatOpenAI(
        base_url=str(client.openai_api_base),
        model=str(client.model_name),
        api_key=SecretStr("EMPTY"),
        temperature=args.temperature,
        max_completion_tokens=args.max_tokens,
        timeout=900,
    )


class Run:
    """The cases of one folder, `concurrency` at a time; each finished one appended at once,
    each failed one in errors.jsonl (a rerun tries it again); the run gives up after more
    failures in a row than cases in flight (GiveUpRule)."""

    def __init__(
        self,
        store: RecordStore,
        middleware: MURMiddleware,
        model: ChatOpenAI,
        settings: dict[str, Any],
        keys: dict[str, JobKey],
        concurrency: int,
    ) -> None:
        self.store, self.middleware, self.model = store, middleware, model
        self.settings, self.keys = settings, keys
        self.slots = asyncio.Semaphore(concurrency)
        self.rule = GiveUpRule.for_concurrency(concurrency)
        self.failed = 0

    async def all(self, cases: Sequence[bfcl.Case]) -> int:
        await asyncio.gather(*(self.one(case) for case in cases))
        if self.rule.gone:
            print(f"gave up: {self.rule.gone}", file=sys.stderr)
        return self.failed

    async def one(self, case: bfcl.Case) -> None:
        async with self.slots:
            if self.rule.gone:
                return
            started = time.monotonic()
            try:
                done = await bfcl.run_case(case, self.model, self.middleware)
            except (openai.APIError, httpx.HTTPError, ServerError) as exc:
                self.fail(case, exc)
                return
            record = bfcl.case_record(
                self.keys[case.id], case, done, time.monotonic() - started, self.settings
            )
            self.store.append(record)
            self.rule.succeeded()
            usage = record["usage"]
            print(
                f"{case.id}: {'valid' if record['correct'] else record['trace']['check']}, "  # type: ignore[typeddict-item]
                f"{record['steps_total']} calls, {record['steps_scaled']} escalated, tokens "
                f"{usage['backbone_tokens']} + {usage['external_tokens']}",
                flush=True,
            )

    def fail(self, case: bfcl.Case, exc: Exception) -> None:
        why = describe_failure(exc)
        self.failed += 1
        key = self.keys[case.id].text
        self.store.append_error({"key": key, "error": type(exc).__name__, "message": why})
        self.rule.failed(why, server=True)
        print(f"{case.id}: failed: {why}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
