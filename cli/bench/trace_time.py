"""`mur bench trace_time`: its command line, the flags checked and turned into the timed runs;
timing each question alone, resuming and the table are benchmarks/trace_time.py's."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mur.benchmarks import trace_time
from mur.cli.args import OneLineParser, comma_choices, positive_int, usage_error
from mur.cli.connection import add_connection_arguments, connection_options
from mur.evals.questions import load_dataset
from mur.graphs.mur import build_graph
from mur.graphs.state import Context
from mur.servers.clients.environment import EnvEndpoints
from mur.servers.clients.errors import ServerError
from mur.servers.connect import connect
from mur.servers.processes.facts import ServerFacts, describe_recorded, server_facts
from mur.servers.processes.profiles import get_profile

TIMED_PROFILE = "cpu-qwen-1.5b"  # the experiments' server, started or reused without --base-url

PROG = "mur bench trace_time"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=(trace_time.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dataset", default="math500")
    parser.add_argument("--offset", type=int, default=200, help="skip the first N questions")
    parser.add_argument("--limit", type=positive_int, default=10, help="questions to time")
    parser.add_argument(
        "--arms",
        type=comma_choices(trace_time.ARMS, "arm"),
        default=tuple(trace_time.TRACE_ARMS),
        help=f"comma list of {', '.join(trace_time.ARMS)} (default: the trace rules, "
        f"{', '.join(trace_time.TRACE_ARMS)})",
    )
    parser.add_argument("--top-logprobs", type=int, default=20, help="as the experiments")
    parser.add_argument(
        "--random-rate",
        type=float,
        help="the random gate's rate, which an arm with that gate needs (cascade-random: MUR's "
        "realised rate on the main run, as its pre-registration says)",
    )
    parser.add_argument("--max-steps", type=positive_int, help="override the profile's")
    parser.add_argument("--max-step-tokens", type=positive_int, help="override the profile's")
    parser.add_argument(
        "--out",
        type=Path,
        help="save every timed run (JSON) as it finishes; the same command resumes from it",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="print the table of the runs --out holds and exit, without a server",
    )
    add_connection_arguments(
        parser,
        defaults=f"The server to time: --base-url, else the --profile server (default "
        f"{TIMED_PROFILE}), started here or reused; the profile's recommended settings apply. "
        "The cascade arms' external model: --verifier-url, else the --verifier-profile server.",
    )
    parser.set_defaults(profile=TIMED_PROFILE)
    return parser


def recorded_table(out: Path | None, arms: Sequence[str]) -> int:
    """--table: the table of an --out file's runs, with the server they were timed on."""
    if out is None or not out.is_file():
        given = f"{out} does not exist" if out else "none given"
        return usage_error(PROG, f"--table reads the runs of --out FILE ({given})")
    try:
        document, runs = trace_time.read(out)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    print(f"{len(runs)} runs timed alone on {describe_recorded(document.get('server') or {})}")
    print(trace_time.table(runs, arms))
    return 0


def timed_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The graph settings every arm shares: the profile's, the flags' and the experiments'."""
    flags = ("max_steps", "max_step_tokens", "random_rate")
    return {
        **get_profile(args.profile).recommended,
        "strategy": "critic",
        "gate": "never",
        "top_logprobs": args.top_logprobs,
        **{name: getattr(args, name) for name in flags if getattr(args, name) is not None},
    }


def check_arms(args: argparse.Namespace, settings: dict[str, Any]) -> str | None:
    """What makes the chosen arms impossible with these flags (None: nothing), found before a
    server is started for them."""
    for arm in args.arms:
        own = trace_time.arm_settings(arm)
        if own.get("gate") == "random" and args.random_rate is None:
            return f"arm {arm} draws steps at random: give its rate with --random-rate"
        try:
            Context(**{**settings, **own})
        except ValueError as exc:
            return str(exc)
    external = EnvEndpoints.read()
    if needs_external(args.arms) and not (
        args.verifier_url or args.verifier_profile or external.verifier_url
    ):
        return (
            "the cascade arms need the external model's server: give --verifier-url URL or "
            "--verifier-profile NAME (e.g. cpu-qwen-1.5b beside --profile cpu-qwen-0.5b)"
        )
    return None


def needs_external(arms: Sequence[str]) -> bool:
    """An arm escalates steps to the external model, or has it write alone."""
    return any(
        trace_time.writer(arm) == "verifier"
        or trace_time.arm_settings(arm).get("strategy") == "escalate"
        for arm in arms
    )


@dataclass(frozen=True)
class Servers:
    """The graph each writer runs, the servers whose counters a run must move alone, and
    what they are."""

    graphs: dict[str, Any]
    urls: list[str]
    facts: ServerFacts
    verifier: ServerFacts | None


def servers_for(args: argparse.Namespace) -> Servers:
    """The servers (started or reused, as mur solve does) and a graph per writer."""
    connection = connect(**connection_options(args), start=True, progress=True)
    backbone, verifier = connection.backbone, connection.verifier
    urls = [backbone.openai_api_base]
    external = None
    writers = {trace_time.writer(arm) for arm in args.arms}
    if needs_external(args.arms):  # its graph warms the external model's server up too
        urls += [verifier.openai_api_base] * (verifier.openai_api_base not in urls)
        external = server_facts(verifier.openai_api_base, verifier.model_name)
        writers.add("verifier")
    models = {"backbone": backbone, "verifier": verifier}
    return Servers(
        graphs={
            writer: build_graph(backbone=models[writer], verifier=verifier)
            for writer in sorted(writers)
        },
        urls=urls,
        facts=server_facts(backbone.openai_api_base, backbone.model_name),
        verifier=external,
    )


async def run(args: argparse.Namespace) -> int:
    """Every flag checked before a server is started for it, then each (question, arm) not
    yet in --out timed alone, saved as it finishes, and the table."""
    if args.table:
        return recorded_table(args.out, args.arms)
    try:  # bad questions are found before a server is started for them
        questions = load_dataset(args.dataset, limit=args.limit, offset=args.offset)
    except (ValueError, OSError) as exc:
        return usage_error(PROG, str(exc))
    if args.out and (args.out.is_dir() or not args.out.parent.is_dir()):
        return usage_error(PROG, f"--out {args.out}: give a file in a folder that exists")
    settings = timed_settings(args)
    if (problem := check_arms(args, settings)) is not None:
        return usage_error(PROG, problem)
    try:  # as mur solve: the profile's request timeouts, its server started or reused
        servers = servers_for(args)
    except ServerError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    plan = json.loads(json.dumps(  # as an --out file reads it back (tuples become lists)
        {"dataset": args.dataset, "offset": args.offset, "arms": args.arms, "settings": settings}
    ))  # fmt: skip
    try:
        runs = trace_time.resume(args.out, servers.facts, plan, servers.verifier)
    except ValueError as exc:
        return usage_error(PROG, str(exc))
    by_id = {question.id: question for question in questions}
    todo = trace_time.schedule(list(by_id), args.arms, runs)
    kept = f"{len(by_id) * len(args.arms) - len(todo)} runs already in {args.out}, " if runs else ""
    print(f"timing {len(questions)} questions alone on {servers.facts.describe()}: {kept}"
          f"{len(todo)} to go", file=sys.stderr)  # fmt: skip
    for graph in servers.graphs.values() if todo else ():
        await trace_time.warm_up(graph, by_id[todo[0][0]], settings)
    for problem_id, arm in todo:
        graph = servers.graphs[trace_time.writer(arm)]
        try:
            timed = await trace_time.solve_alone(
                graph, arm, by_id[problem_id], settings, servers.urls
            )
        except (trace_time.NotAlone, ServerError) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        runs.append(timed)
        if args.out:
            trace_time.save(args.out, servers.facts, plan, runs, servers.verifier)
        print(f"{problem_id} {arm}: {timed.wall_s:.1f} s, {timed.tokens} tokens", file=sys.stderr)
    print(trace_time.table([run for run in runs if run.problem_id in by_id], args.arms))
    return 0


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:  # the runs timed so far are in --out already (saved one by one)
        kept = f"; the runs timed before it are in {args.out}, the same command resumes"
        print(f"{PROG}: stopped (Ctrl-C): the run in flight is not kept"
              f"{kept if args.out else ''}", file=sys.stderr)  # fmt: skip
        return 130


if __name__ == "__main__":
    sys.exit(main())
