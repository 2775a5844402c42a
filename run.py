"""MUR from the command line: solve one question step by step, or run a benchmark.

    python run.py --strategy critic                       # the built-in sample problem
    python run.py --strategy critic --question "..." --json
    python run.py --strategy critic --dataset math500 --limit 8 --gate mur,always,never --out DIR

Without --base-url (or MUR_BASE_URL) it uses the embedded CPU vLLM server (reused when
healthy, started if not).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.text import Text

from mur.evals.harness.plan import BenchmarkPlan
from mur.evals.questions import Problem, load_dataset
from mur.evals.questions.datasets import describe as describe_datasets
from mur.graphs.model_calls import describe_failure, server_roles
from mur.graphs.mur import build_graph
from mur.graphs.refine import summarise
from mur.graphs.solve import solve
from mur.graphs.state import Context, context_for
from mur.nodes.draft import check_question
from mur.nodes.gate_labels import budget_label
from mur.servers import ServerError
from mur.servers.cli import OneLineParser, usage_error
from mur.servers.connect import (
    Connection,
    add_connection_arguments,
    check_connection_flags,
    connection_options,
)
from mur.servers.connect import connect as connect_servers
from mur.servers.sessions import new_session_id, session

SAMPLE_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?"
)

# Context fields that take a comma-separated list with --dataset: the benchmark sweeps them.
SWEEPS: tuple[str, ...] = ("gate", "gamma", "budget_tokens", "target_scale_rate")
# Context fields every command names itself (required flags, kept apart from the shared settings).
CHOSEN: tuple[str, ...] = ("strategy",)
# What a flag takes beyond its Context field (nodes.gate_labels.parse_gate_label reads the labels).
FLAG_NOTES: dict[str, str] = {
    "gate": "Labels: mur+bc = mur with bias correction, random@0.12 = random at that rate, "
    "mur[budget=800] / mur[rate=0.2] = budget mode (as --budget-tokens / --target-scale-rate).",
}


class UsageError(Exception):
    """Bad command-line input: reported in one line with exit status 2."""


def _csv(kind: type) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return [kind(item) for item in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a list of {kind.__name__}: {text}") from exc

    return parse


def _flag_kind(annotation: Any) -> tuple[type, tuple[Any, ...] | None]:
    """The argparse type of a Context field, and its choices when it is a Literal."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_kind(args[0])  # `int | None`: the flag gives an int
    if typing.get_origin(annotation) is typing.Literal:
        return type(args[0]), tuple(args)
    return annotation, None


def add_context_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Context field, named after it (`max_step_tokens` -> --max-step-tokens),
    typed, bounded and described by the field; unset flags stay None."""
    group = parser.add_argument_group("settings (graphs.Context; default: the paper's)")
    for name, info in Context.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind, choices = _flag_kind(info.annotation)
        help_text = _help(name, info, choices, sweep=name in SWEEPS)
        if kind is bool:
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif name in SWEEPS:
            group.add_argument(
                flag, dest=name, type=_csv(kind), metavar=name.upper(), help=help_text
            )
        else:
            group.add_argument(
                flag,
                dest=name,
                type=kind,
                choices=choices,
                required=name in CHOSEN,
                help=help_text,
            )


def _help(name: str, info: FieldInfo, choices: tuple[Any, ...] | None, sweep: bool) -> str:
    """The field's description, then its choices or bounds and its default."""
    text = (info.description or "").replace("%", "%%")
    if name in FLAG_NOTES:
        text += " " + FLAG_NOTES[name]
    if sweep:
        text += " A comma list with --dataset."
    limits = [
        f"{symbol} {getattr(rule, attr)}"
        for rule in info.metadata
        for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
        if hasattr(rule, attr)
    ]
    if choices:
        limits = [f"one of {', '.join(map(str, choices))}"]
    default = "required" if name in CHOSEN else f"default {info.default}"
    return f"{text} ({'; '.join([*limits, default])})"


def _concurrency(text: str) -> int | None:
    """`auto` (None: measured) or a positive number of questions."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or 'auto': {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or 'auto'), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="run.py", description="MUR: momentum-uncertainty-guided step-level reasoning."
    )
    add_context_flags(parser)
    parser.add_argument("--question", help="the question to solve (default: a sample problem)")
    parser.add_argument("--system-prompt", default=None)
    add_connection_arguments(parser)
    parser.add_argument("--eager", action="store_true", help="start the embedded server eager")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--dataset", help=f"run a benchmark: {describe_datasets()}")
    parser.add_argument("--data-dir", help="benchmark data folder (or 'hf' for the hub)")
    parser.add_argument("--limit", type=int, help="first N questions of the dataset")
    parser.add_argument("--samples", type=int, default=1, help="samples per question")
    parser.add_argument(
        "--concurrency",
        type=_concurrency,
        default=None,
        help="questions in flight (default auto: measured on the servers at 8/16/32/64 "
        "streams, recorded in the folder's settings.json)",
    )
    parser.add_argument(
        "--allow-mixed-servers",
        action="store_true",
        help="resume a benchmark folder on a server whose dtype, vLLM version or logprobs "
        "mode differs from the recorded one (the mix is recorded)",
    )
    parser.add_argument("--out", help="benchmark output folder (records.jsonl, tables)")
    parser.add_argument(
        "--checkpoint", help="SQLite file that checkpoints the run after every node (resumable)"
    )
    parser.add_argument(
        "--thread-id", help="the run's id in --checkpoint: the same id resumes where it stopped"
    )
    return parser


def connect(args: argparse.Namespace, say: Callable[[str], None]) -> Connection:
    """Clients from the flags, else MUR_BASE_URL etc., else the embedded CPU server (started
    if needed): `servers.connect`, probing every URL first so a wrong one fails in seconds."""
    connection = connect_servers(
        **connection_options(args),
        start=True,
        eager=args.eager,
        progress=not args.json,
        say=say,
    )
    args.profile = connection.profile
    return connection


def flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Context settings given on the command line, but the swept and chosen ones."""
    return {
        name: getattr(args, name)
        for name in Context.field_names()
        if name not in (*SWEEPS, *CHOSEN) and getattr(args, name) is not None
    }


def shared_settings(args: argparse.Namespace, recommended: Mapping[str, Any]) -> dict[str, Any]:
    """A profile's recommendations (those that are Context fields), then the flags."""
    names = set(Context.field_names())
    return {**{k: v for k, v in recommended.items() if k in names}, **flag_settings(args)}


def gates(args: argparse.Namespace) -> list[str]:
    return args.gate or [Context.model_fields["gate"].default]


def gammas(args: argparse.Namespace) -> list[float]:
    return args.gamma or [Context.model_fields["gamma"].default]


def budget_settings(args: argparse.Namespace) -> list[tuple[str, float]]:
    """Budget-mode variants asked for on the command line."""
    return [("budget_tokens", b) for b in args.budget_tokens or []] + [
        ("target_scale_rate", r) for r in args.target_scale_rate or []
    ]


def budget_labels(args: argparse.Namespace) -> list[str]:
    """The budget-mode variants as the gate labels their records carry (`mur[budget=300]`)."""
    return [budget_label(name, value) for name, value in budget_settings(args)]


def single_context(args: argparse.Namespace, recommended: Mapping[str, Any]) -> Context:
    """The Context of a single solve (no lists: validate() refused them): a budget makes it
    the mur gate; a gate label brings its own settings (`mur+bc`, `random@0.12`)."""
    label = (budget_labels(args) or gates(args))[0]
    settings = {**shared_settings(args, recommended), "strategy": args.strategy}
    return context_for(label, settings, gamma=gammas(args)[0])


def validate(args: argparse.Namespace) -> None:
    """Every bad value fails here, before any server is touched."""
    settings = flag_settings(args)
    for label in [*gates(args), *budget_labels(args)]:
        for gamma in gammas(args):
            context_for(label, settings, gamma=gamma)
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be > 0, got {args.limit}")
    if args.samples <= 0:
        raise UsageError("--samples must be > 0")
    if not args.dataset:
        if len(gates(args)) > 1 or len(gammas(args)) > 1 or len(budget_settings(args)) > 1:
            raise UsageError("lists of gates, gammas or budgets need --dataset")
        if args.question is not None:
            check_question(args.question)
    elif args.question or args.checkpoint:
        raise UsageError("--question and --checkpoint solve one question: drop --dataset")
    if args.thread_id and not args.checkpoint:
        raise UsageError("--thread-id needs --checkpoint")
    try:
        check_connection_flags(args)
    except ServerError as exc:
        raise UsageError(str(exc)) from None


class Printer:
    """Human output: each kept step as it arrives, then the answer and the usage."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.console = Console(stderr=False, highlight=False)

    def say(self, text: str) -> None:
        if self.enabled:
            self.console.print(f"[dim]{text}[/dim]")

    def step(self, event: dict[str, Any]) -> None:
        if not self.enabled:
            return
        threshold = event["threshold"]
        numbers = (
            f"m={event['draft_uncertainty']:.3f}  M={event['momentum_before']:.3f}  "
            f"thr={threshold:.3f}"
            if threshold is not None
            else f"m={event['draft_uncertainty']:.3f}  M={event['momentum_before']:.3f}"
        )
        summary = summarise(event["refine"])
        mark = (
            f"[bold yellow]SCALED ({event['strategy']}{f': {summary}' if summary else ''})"
            "[/bold yellow]"
            if event["scaled"]
            else "[green]kept[/green]"
        )
        self.console.print(f"[bold]Step{event['index']}[/bold]  {numbers}  {mark}")
        if event["scaled"]:
            self.console.print(f"   [dim]kept m={event['uncertainty']:.3f}[/dim]")
        self.console.print(f"   {event['text']}", markup=False)

    def result(self, result: dict[str, Any]) -> None:
        if not self.enabled:
            return
        usage = result["usage"]
        scaled = sum(step["scaled"] for step in result["steps"])
        if result.get("fallback"):
            self.console.print(Text.assemble(("fallback: ", "dim"), result["fallback"]["text"]))
        self.console.print(
            f"\n[bold]Answer:[/bold] {result['answer']}   "
            f"[dim](finish: {result['finish_reason']}, {len(result['steps'])} steps, "
            f"{scaled} scaled)[/dim]"
        )
        self.console.print(
            f"Tokens: backbone {usage['backbone_tokens']}, external {usage['external_tokens']}, "
            f"prompt {usage['backbone_prompt_tokens'] + usage['external_prompt_tokens']}, "
            f"LLM calls {usage['llm_calls']}"
        )


async def solve_one(args: argparse.Namespace, connection: Connection, printer: Printer) -> dict:
    """Solve --question (or the sample), printing each step as it is kept."""
    context = single_context(args, connection.recommended)
    question = args.question or SAMPLE_QUESTION
    printer.say(f"Question: {question}")

    def graph(checkpointer: Any = None) -> Any:
        return build_graph(
            backbone=connection.backbone,
            verifier=connection.verifier,
            checkpointer=checkpointer,
        )

    # Every request of this question carries one session id (sticky behind vllm-router).
    if not args.checkpoint:
        with session(new_session_id("run.py", uuid.uuid4().hex[:12])):
            solution = await solve(
                graph(),
                question,
                system_prompt=args.system_prompt,
                context=context,
                on_step=printer.step,
            )
        return solution.output
    thread_id = args.thread_id or uuid.uuid4().hex[:12]
    async with AsyncSqliteSaver.from_conn_string(args.checkpoint) as saver:
        printer.say(
            f"Checkpointing thread {thread_id} in {args.checkpoint}: resume with "
            f"--checkpoint {args.checkpoint} --thread-id {thread_id}"
        )
        with session(new_session_id("run.py", thread_id)):
            solution = await solve(
                graph(saver),
                question,
                system_prompt=args.system_prompt,
                context=context,
                config={"configurable": {"thread_id": thread_id}},
                on_step=printer.step,
                on_resume=lambda: printer.say(f"Resuming thread {thread_id}"),
            )
        return solution.output


def command_line(argv: Sequence[str] | None) -> str:
    """The command as it was typed, for command.txt: the `mur` command (the console script
    for `main`), or the interpreter and run.py."""
    words = list(sys.argv[1:] if argv is None else argv)
    if argv is None and not sys.argv[0].endswith(".py"):  # the `mur` console script
        return shlex.join([_relative(sys.argv[0]), *words])
    script = sys.argv[0] if argv is None else "run.py"
    return shlex.join([_relative(sys.executable), script, *words])


def _relative(path: str) -> str:
    """`path` relative to the working folder when it lies inside it (.venv/bin/python)."""
    return os.path.relpath(path) if Path(path).is_relative_to(Path.cwd()) else path


def load_problems(args: argparse.Namespace) -> list[Problem]:
    return load_dataset(args.dataset, args.data_dir, limit=args.limit)


def benchmark_plan(
    args: argparse.Namespace, problems: Sequence[Problem], connection: Connection, command: str
) -> BenchmarkPlan:
    """The runner's typed plan (evals.harness.plan.BenchmarkPlan) from the flags."""
    return BenchmarkPlan(
        dataset=args.dataset,
        strategy=args.strategy,
        problems=tuple(problems),
        gates=tuple(gates(args)),
        gammas=tuple(gammas(args)),
        budgets=tuple(budget_settings(args)),
        samples=args.samples,
        concurrency=args.concurrency,
        allow_mixed_servers=args.allow_mixed_servers,
        settings=shared_settings(args, connection.recommended),
        out=Path(args.out) if args.out else None,
        command=command,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        validate(args)
        problems = load_problems(args) if args.dataset else None
    except (UsageError, ValueError, OSError) as exc:
        return usage_error("run.py", str(exc))

    printer = Printer(enabled=not args.json)
    try:
        connection = connect(args, printer.say)
    except ServerError as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return 1
    if problems is not None:
        # Here: the benchmark brings statistics and plots (scipy, matplotlib), seconds of
        # imports that a single question, or a wrong --base-url, must not wait for.
        from mur.evals.benchmark import run_benchmark  # noqa: PLC0415

        plan = benchmark_plan(args, problems, connection, command_line(argv))
        return run_benchmark(plan, connection.backbone, connection.verifier)
    try:
        result = asyncio.run(solve_one(args, connection, printer))
    except KeyboardInterrupt:
        hint = " (rerun with the same --checkpoint and --thread-id to resume)" * bool(
            args.checkpoint
        )
        print(f"run.py: interrupted{hint}", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line instead of a traceback; exit status 1
        roles = server_roles(connection.backbone, connection.verifier)
        check = "`python -m servers status`" if connection.embedded else None
        print(f"run.py: {describe_failure(exc, roles, check)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        printer.result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
