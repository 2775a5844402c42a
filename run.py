"""MUR from the command line: solve one question step by step, or run a benchmark.

    python run.py --strategy critic                       # the built-in sample problem
    python run.py --strategy critic --question "..." --json
    python run.py --strategy critic --dataset math500 --limit 8 --gate mur,always,never --out DIR

Without --base-url it uses the embedded CPU vLLM server (reused when healthy, started if not).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

SAMPLE_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?"
)

# Context fields settable from the command line: flag -> (Context field, type).
CONTEXT_FLAGS: dict[str, tuple[str, type]] = {
    "--alpha": ("alpha", float),
    "--tau": ("tau", float),
    "--random-rate": ("random_rate", float),
    "--seed": ("seed", int),
    "--max-steps": ("max_steps", int),
    "--max-step-tokens": ("max_step_tokens", int),
    "--num-candidates": ("num_candidates", int),
    "--critic-rounds": ("critic_rounds", int),
    "--judge-max-tokens": ("judge_max_tokens", int),
    "--foresight-steps": ("foresight_steps", int),
    "--thinking-budget": ("thinking_budget", int),
}


class UsageError(Exception):
    """Bad command-line input: reported in one line with exit status 2."""


def _csv(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return [kind(item) for item in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a list of {kind.__name__}: {text}") from exc

    return parse


def build_parser() -> argparse.ArgumentParser:
    from graphs.state import STRATEGIES

    parser = argparse.ArgumentParser(
        prog="run.py", description="MUR: momentum-uncertainty-guided step-level reasoning."
    )
    parser.add_argument("--strategy", required=True, choices=STRATEGIES)
    parser.add_argument(
        "--gate",
        type=_csv(str),
        default=["mur"],
        help="mur, always, never, average, smart, random (a comma list with --dataset)",
    )
    parser.add_argument(
        "--gamma", type=_csv(float), default=[0.9], help="gamma (> 0; a list with --dataset)"
    )
    for flag, (name, kind) in CONTEXT_FLAGS.items():
        parser.add_argument(flag, dest=name, type=kind, default=None)
    parser.add_argument(
        "--budget-tokens",
        type=_csv(int),
        default=None,
        help="budget mode (gate mur): tokens per question; a list with --dataset",
    )
    parser.add_argument(
        "--target-scale-rate",
        type=_csv(float),
        default=None,
        help="budget mode (gate mur): fraction of steps to scale; a list with --dataset",
    )
    parser.add_argument("--expected-steps", type=int, default=None)
    parser.add_argument("--bias-correction", action="store_true", default=None)
    parser.add_argument(
        "--reuse-draft",
        action="store_true",
        default=None,
        help="best_of_n/foresight: keep the draft as candidate 0 (N-1 new samples)",
    )
    parser.add_argument(
        "--foresight-selection",
        choices=("sample", "argmax"),
        default=None,
        dest="foresight_selection",
    )
    parser.add_argument("--thinking-style", choices=("prefix", "qwen3"), default=None)
    parser.add_argument("--question", help="the question to solve (default: a sample problem)")
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument(
        "--base-url",
        help="backbone OpenAI-compatible URL: one vLLM server, or a vllm-router in front of "
        "replicas (`python -m servers up --replicas N`) (default: embedded)",
    )
    parser.add_argument("--model", help="backbone model name (default: what the server serves)")
    parser.add_argument(
        "--verifier-url",
        help="verifier URL, a server or a router (default: the backbone's)",
    )
    parser.add_argument("--verifier-model", help="verifier model name")
    parser.add_argument(
        "--profile",
        default=None,
        help="server profile whose recommended settings apply (default: cpu-tiny when embedded)",
    )
    parser.add_argument("--eager", action="store_true", help="start the embedded server eager")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--dataset", help="run a benchmark: math500, aime24, aime25, gpqa_diamond")
    parser.add_argument("--data-dir", help="benchmark data folder (or 'hf' for the hub)")
    parser.add_argument("--limit", type=int, help="first N questions of the dataset")
    parser.add_argument("--samples", type=int, default=1, help="samples per question")
    parser.add_argument("--concurrency", type=int, default=8, help="questions in flight")
    parser.add_argument("--out", help="benchmark output folder (records.jsonl, tables)")
    parser.add_argument(
        "--checkpoint", help="SQLite file that checkpoints the run after every node (resumable)"
    )
    parser.add_argument(
        "--thread-id", help="the run's id in --checkpoint: the same id resumes where it stopped"
    )
    return parser


@dataclass
class Connection:
    backbone: Any
    verifier: Any
    recommended: dict[str, Any]
    note: str


def connect(args: argparse.Namespace, say: Any) -> Connection:
    """Clients for the requested endpoints, or the embedded CPU server (started if needed).

    A URL may be one vLLM server or a vllm-router in front of replicas: every request of one
    question carries its session header (servers.sessions), which the router's
    consistent_hash policy uses to keep the question on one replica.
    """
    from servers import DEFAULT_PROFILE, get_profile, make_chat_model, up

    def describe(model: Any) -> str:
        return f"{model.model_name} at {model.openai_api_base}"

    recommended: dict[str, Any] = {}
    if args.base_url:
        base_url, model = args.base_url, args.model
    else:
        say("Using the embedded CPU vLLM server (cpu-tiny); pass --base-url to use another.")
        server = up(DEFAULT_PROFILE, eager=args.eager, progress=not args.json)
        say(f"{'Started' if server.started else 'Reusing'} {server.model} at {server.base_url}")
        base_url, model = server.base_url, server.model
        args.profile = args.profile or DEFAULT_PROFILE
    if args.profile:
        recommended = dict(get_profile(args.profile).recommended)
    backbone = make_chat_model(base_url, model)
    note = f"{'backbone' if args.base_url else 'embedded'} {describe(backbone)}"
    verifier = backbone
    if args.verifier_url or args.verifier_model:
        verifier = make_chat_model(args.verifier_url or base_url, args.verifier_model)
        note += f"; verifier {describe(verifier)}"
    return Connection(backbone, verifier, recommended, note)


def make_context(
    args: argparse.Namespace,
    gate: str,
    gamma: float,
    recommended: dict,
    budget: tuple[str, float] | None = None,
) -> Any:
    """The run's Context: profile recommendations, then flags; `budget` is
    ("budget_tokens" | "target_scale_rate", value) for budget mode."""
    from graphs.state import Context

    names = set(Context.field_names())
    settings = {k: v for k, v in recommended.items() if k in names}
    # Every Context field has a flag of the same name (argparse dest); unset flags are None.
    for name in names - {"gate", "gamma", "budget_tokens", "target_scale_rate"}:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    if budget is not None:
        settings[budget[0]] = budget[1]
    return Context(gate=gate, gamma=gamma, **settings)


def validate(args: argparse.Namespace) -> None:
    """Every bad value fails here, before any server is touched."""
    from nodes.draft import check_question
    from nodes.gates import check_gate

    for gate in args.gate:
        check_gate(gate)
    for gamma in args.gamma:
        make_context(args, args.gate[0], gamma, {})
    for budget in budget_settings(args):
        make_context(args, "mur", args.gamma[0], {}, budget)
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be > 0, got {args.limit}")
    if args.samples <= 0 or args.concurrency <= 0:
        raise UsageError("--samples and --concurrency must be > 0")
    if not args.dataset:
        if len(args.gate) > 1 or len(args.gamma) > 1 or len(budget_settings(args)) > 1:
            raise UsageError("lists of gates, gammas or budgets need --dataset")
        if args.question is not None:
            check_question(args.question)
    elif args.question or args.checkpoint:
        raise UsageError("--question and --checkpoint solve one question: drop --dataset")
    if args.thread_id and not args.checkpoint:
        raise UsageError("--thread-id needs --checkpoint")
    if args.model and not args.base_url:
        raise UsageError("--model needs --base-url")
    from servers import ServerError, check_single_url

    for flag, url in (("--base-url", args.base_url), ("--verifier-url", args.verifier_url)):
        try:
            check_single_url(url, flag)
        except ServerError as exc:
            raise UsageError(str(exc)) from None


def budget_settings(args: argparse.Namespace) -> list[tuple[str, float]]:
    """Budget-mode variants asked for on the command line."""
    return [("budget_tokens", b) for b in args.budget_tokens or []] + [
        ("target_scale_rate", r) for r in args.target_scale_rate or []
    ]


class Printer:
    """Human output: each kept step as it arrives, then the answer and the usage."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console

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
        mark = (
            f"[bold yellow]SCALED ({event['strategy']}{_refine_summary(event['refine'])})"
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
            self.console.print(f"[dim]fallback:[/dim] {result['fallback']['text']}", markup=False)
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


def _refine_summary(refine: dict[str, Any] | None) -> str:
    if not refine:
        return ""
    if refine["strategy"] == "critic":
        return ": revised" if refine["revised"] else ": judged correct"
    if refine["strategy"] in ("best_of_n", "foresight"):
        return f": chose {refine['chosen'] + 1} of {len(refine['candidates'])}"
    if refine["strategy"] == "thinking":
        return f": thought {refine['thinking_tokens']} tokens"
    return ""


async def solve(
    graph: Any,
    question: str,
    system_prompt: str | None,
    context: Any,
    printer: Printer,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Stream the graph: print each step as it is kept, return the output contract.

    With a checkpointed thread that already holds progress, the run resumes from it.
    """
    from graphs.state import output_of

    graph_input: dict[str, Any] | None = {"question": question, "system_prompt": system_prompt}
    if config is not None:
        snapshot = await graph.aget_state(config)
        if snapshot.next:
            printer.say(f"Resuming thread {config['configurable']['thread_id']}")
            graph_input = None
        elif snapshot.values:
            return output_of(snapshot.values)  # that thread already finished
    result: dict[str, Any] = {}
    async for mode, chunk in graph.astream(
        graph_input, config=config, context=context, stream_mode=["custom", "values"]
    ):
        if mode == "custom" and chunk.get("event") == "step":
            printer.step(chunk)
        elif mode == "values":
            result = chunk
    return output_of(result)


async def solve_one(args: argparse.Namespace, connection: Connection, printer: Printer) -> dict:
    from graphs.mur import build_graph

    budgets = budget_settings(args)
    context = make_context(
        args,
        "mur" if budgets else args.gate[0],
        args.gamma[0],
        connection.recommended,
        budgets[0] if budgets else None,
    )
    question = args.question or SAMPLE_QUESTION
    printer.say(f"Question: {question}")
    build = partial(
        build_graph,
        args.strategy,
        context.gate,
        backbone=connection.backbone,
        verifier=connection.verifier,
    )
    from servers import new_session_id, session

    if not args.checkpoint:
        with session(new_session_id("run.py", uuid.uuid4().hex[:12])):
            return await solve(build(), question, args.system_prompt, context, printer)
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    thread_id = args.thread_id or uuid.uuid4().hex[:12]
    async with AsyncSqliteSaver.from_conn_string(args.checkpoint) as saver:
        printer.say(
            f"Checkpointing thread {thread_id} in {args.checkpoint}: resume with "
            f"--checkpoint {args.checkpoint} --thread-id {thread_id}"
        )
        config = {"configurable": {"thread_id": thread_id}}
        with session(new_session_id("run.py", thread_id)):
            return await solve(
                build(checkpointer=saver), question, args.system_prompt, context, printer, config
            )


def describe_failure(exc: BaseException) -> str:
    """One line for the errors a user can meet while the graph runs."""
    import openai

    from nodes.llm import MissingLogprobsError

    if isinstance(exc, openai.APIConnectionError):
        return f"lost the model server ({exc}); is it still running? `python -m servers status`"
    if isinstance(exc, openai.APIStatusError):
        return f"the model server refused a request (HTTP {exc.status_code}): {exc.message}"
    if isinstance(exc, MissingLogprobsError | ValueError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        validate(args)
        problems = load_problems(args) if args.dataset else None
    except (UsageError, ValueError, OSError) as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2

    from servers import ServerError

    printer = Printer(enabled=not args.json)
    try:
        connection = connect(args, printer.say)
    except ServerError as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return 1
    if problems is not None:
        from evals.runner import run_benchmark

        return run_benchmark(args, problems, connection, make_context, budget_settings(args))
    try:
        result = asyncio.run(solve_one(args, connection, printer))
    except KeyboardInterrupt:
        hint = " (rerun with the same --checkpoint and --thread-id to resume)" * bool(
            args.checkpoint
        )
        print(f"run.py: interrupted{hint}", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line instead of a traceback; exit status 1
        print(f"run.py: {describe_failure(exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        printer.result(result)
    return 0


def load_problems(args: argparse.Namespace) -> list[Any]:
    """The benchmark's questions, read before any server starts (bad paths fail fast)."""
    from evals.datasets import load_dataset

    return load_dataset(args.dataset, args.data_dir, limit=args.limit)


if __name__ == "__main__":
    sys.exit(main())
