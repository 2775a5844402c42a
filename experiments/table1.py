"""The paper's Table 1 in miniature, as one resumable command.

    python -m experiments.table1 --base-url http://127.0.0.1:8022/v1 --profile cpu-qwen-1.5b
    python -m experiments.table1 ... --dry-run          # the mur commands it would run

For each strategy, into `<results>/<dataset>-<strategy>-<tag>/`, three phases, each one
`mur ... --dataset` command (`mur` is run.py's command, installed with the project), so each
folder's command.txt reads like a user's:

1. main: the paper's rows (nodes.gate_labels.PAPER_TABLE_LABELS: never, always, mur, mur+bc,
   average, smart) at the headline gamma;
2. random: the random gate at the rate that scales as many steps as MUR did in phase 1
   (computed from its records, so phase 1 must be complete);
3. sweep (`--sweep-strategies`, default the first strategy): mur at each `--sweep` gamma.

Every strategy's main phase runs before any random phase, and those before any sweep, so a
table stopped part-way holds the headline rows of every strategy first.

mur skips what a folder already holds, so rerunning the same command after a stop (or in the
next session) goes on where it stopped. The server flags (--base-url, --profile, ...) and the
arguments after `--` go to every mur command (e.g. `-- --max-steps 8`).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from evals.harness.plan import gate_variants
from evals.harness.record import RunRecord
from evals.harness.records import records_so_far
from evals.harness.stopping import STOP_SIGNALS, STOPPED_EXIT
from evals.questions import DATASETS, check_dataset
from evals.report.headlines import matched_random_rate
from graphs.refine import STRATEGIES
from nodes.gate_labels import PAPER_TABLE_LABELS
from servers.cli import OneLineParser
from servers.connect import add_connection_arguments, connection_argv
from servers.errors import ServerError
from servers.profiles import DEFAULT_PROFILE, get_profile

#: run.py's command (pyproject.toml, [project.scripts]): what a user types.
COMMAND = "mur"
DEFAULT_STRATEGIES = ("critic", "best_of_n")
#: Around gamma 0.9 where the scaled share moves on Qwen2.5-Coder-1.5B: replaying the gate on
#: its never traces scales 3% of steps at 0.7, 8% at 0.8, 28% at 0.9, 43% at 0.95, all at 1.1.
DEFAULT_SWEEP = (0.7, 0.8, 0.95)


class Table1Error(Exception):
    """A phase that cannot run yet, or a mur command that failed: one line, exit status 2."""


@dataclass(frozen=True)
class Phase:
    strategy: str
    name: str  # main | random | sweep
    folder: Path
    gates: tuple[str, ...]  # empty for random: its rate comes from the main phase's records
    gammas: tuple[float, ...]


@dataclass(frozen=True)
class Table1Plan:
    strategies: tuple[str, ...]
    dataset: str
    limit: int
    gamma: float
    sweep: tuple[float, ...]
    sweep_strategies: tuple[str, ...]
    results: Path
    tag: str
    run_args: tuple[str, ...]  # mur flags shared by every command
    main_gates: tuple[str, ...] = PAPER_TABLE_LABELS

    def folder(self, strategy: str) -> Path:
        return self.results / f"{self.dataset}-{strategy}-{self.tag}"

    def phases(self) -> list[Phase]:
        """Every strategy's main phase first, then the random baselines, then the sweeps: a
        table stopped part-way has the headline rows of every strategy before the extras."""
        gammas = (self.gamma,)
        main = [Phase(s, "main", self.folder(s), self.main_gates, gammas) for s in self.strategies]
        random = [Phase(s, "random", self.folder(s), (), ()) for s in self.strategies]
        sweep = [
            Phase(s, "sweep", self.folder(s), ("mur",), self.sweep)
            for s in self.strategies
            if self.sweep and s in self.sweep_strategies
        ]
        return [*main, *random, *sweep]

    def progress(self, phase: Phase) -> tuple[int, int]:
        """(runs recorded, runs the phase asks for), by the runner's own rule
        (`evals.harness.plan.gate_variants`); the random phase counts the runs at MUR's rate only
        (a folder may also hold random at another rate, e.g. mur+bc's)."""
        records = records_so_far(phase.folder)
        if not phase.gates:
            try:
                matched = self.random_gate(phase.folder, records)
            except Table1Error:
                return 0, self.limit  # MUR unfinished: the random phase has not started
            return sum(1 for r in records if r["gate"] == matched), self.limit
        settings = gate_variants(phase.gates, phase.gammas)
        done = sum(
            1
            for r in records
            if any(r["gate"] == label and _same(r["gamma"], gamma) for label, gamma in settings)
        )
        return done, self.limit * len(settings)

    def random_gate(self, folder: Path, records: Sequence[RunRecord] | None = None) -> str:
        """`random@<rate>` at MUR's measured rate: only once MUR has every question.
        ``records``: the folder's, when the caller has read them already."""
        records = records_so_far(folder) if records is None else records
        mur = [r for r in records if r["gate"] == "mur" and _same(r["gamma"], self.gamma)]
        done = len({r["problem_id"] for r in mur})
        if done < self.limit:
            raise Table1Error(
                f"the random baseline needs MUR's scaled rate over all {self.limit} questions, "
                f"and {folder} has MUR (gamma {self.gamma:g}) on {done}: the main phase has "
                "not finished (rerun this command to finish it)"
            )
        return f"random@{matched_random_rate(mur):.3g}"

    def argv(self, phase: Phase) -> list[str]:
        """The mur arguments of a phase (the random phase resolves its rate now)."""
        gates = phase.gates or (self.random_gate(phase.folder),)
        argv = [
            "--strategy", phase.strategy,
            "--dataset", self.dataset,
            "--limit", str(self.limit),
            "--gate", ",".join(gates),
        ]  # fmt: skip
        if phase.gammas:
            argv += ["--gamma", ",".join(f"{g:g}" for g in phase.gammas)]
        return [*argv, *self.run_args, "--out", str(phase.folder)]


def _same(gamma: float | None, wanted: float | None) -> bool:
    """Equal gammas (None: a gamma-blind gate)."""
    if gamma is None or wanted is None:
        return gamma is wanted
    return math.isclose(gamma, wanted)


Runner = Callable[[Sequence[str]], int]


def mur_program() -> list[str]:
    """The `mur` command of the environment this runs in: beside the interpreter (so a
    virtualenv need not be activated), else on the PATH."""
    beside = Path(sys.executable).with_name(COMMAND)
    found = str(beside) if beside.is_file() else shutil.which(COMMAND)
    if found is None:
        raise Table1Error(
            f"the {COMMAND} command is not installed beside {sys.executable} nor on the PATH: "
            "install the project into this environment (`make setup`, or pip install -e .)"
        )
    return [found]


def run_mur(argv: Sequence[str], program: Sequence[str] | None = None) -> int:
    """`mur` (or `program`) in a child process, stopped the way run.py stops
    (evals.harness.stopping): each SIGTERM to this process goes on to it, and so does each
    SIGINT unless the terminal's Ctrl-C reaches the child itself (this process group in the
    terminal's foreground); meanwhile this process waits for the child's finished questions."""
    child = subprocess.Popen([*(program or mur_program()), *argv])
    forward_sigint = not _in_terminal_foreground()

    def forward(sig: int, _frame: FrameType | None) -> None:
        if sig != signal.SIGINT or forward_sigint:
            child.send_signal(sig)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _in_terminal_foreground() -> bool:
    """Whether a Ctrl-C in this process's terminal goes to its process group."""
    try:
        return sys.stdin is not None and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):  # no terminal, or stdin closed
        return False


def run_table(plan: Table1Plan, runner: Runner = run_mur, *, dry_run: bool = False) -> int:
    """Run the phases in order (or, with `dry_run`, print each with its progress and
    command); a failed mur command stops the table."""
    for phase in plan.phases():
        name = f"{phase.strategy} / {phase.name}"
        done, total = plan.progress(phase)
        status = f"{name} ({done} of {total} runs recorded)"
        if dry_run:
            try:
                print(f"# {status}\n{shlex.join([COMMAND, *plan.argv(phase)])}")
            except Table1Error as exc:
                print(f"# {status}: {exc}")
            continue
        argv = plan.argv(phase)
        print(f"== {status}: {shlex.join([COMMAND, *argv])}", file=sys.stderr, flush=True)
        code = runner(argv)
        if code == STOPPED_EXIT:
            print(
                f"experiments.table1: {name} stopped; its finished questions are saved in "
                f"{phase.folder}: rerun this command to go on",
                file=sys.stderr,
            )
            return STOPPED_EXIT
        if code != 0:
            raise Table1Error(
                f"{name} stopped ({COMMAND} exit {code}); its finished questions are saved in "
                f"{phase.folder}: rerun this command to go on"
            )
    return 0


def _csv(kind: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(item) for item in text.split(",") if item.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a comma list of {kind.__name__}: {text}"
            ) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m experiments.table1",
        description="The paper's Table 1 in miniature: every strategy's gates, the random "
        f"baseline at MUR's rate and a gamma sweep, resumable ({COMMAND} skips what is done). "
        f"The server flags and the arguments after -- go to every {COMMAND} command.",
    )
    add = parser.add_argument
    add("--strategies", type=_csv(str), default=DEFAULT_STRATEGIES, help="comma list")
    add("--dataset", default="math500", help=f"one of {', '.join(DATASETS)} (default math500)")
    add("--limit", type=int, default=100, help="first N questions (default 100)")
    add("--gamma", type=float, default=0.9, help="MUR's gamma in the main table (default 0.9)")
    add("--sweep", type=_csv(float), default=DEFAULT_SWEEP, help="gammas of the sweep")
    add("--sweep-strategies", type=_csv(str), help="default: the first strategy")
    add("--gates", type=_csv(str), default=PAPER_TABLE_LABELS, help="the main phase's gates")
    add("--concurrency", type=int, help="questions in flight (default: measured by mur)")
    add("--results", type=Path, default=Path("results"), help="parent of the run folders")
    add("--tag", help="folder suffix naming the model (default: from --profile)")
    add("--dry-run", action="store_true", help=f"print the {COMMAND} commands, run nothing")
    add_connection_arguments(parser)
    return parser


def _default_tag(profile: str | None) -> str:
    name = get_profile(profile or DEFAULT_PROFILE).served_model_name
    return name.lower().removesuffix("-instruct")


def make_plan(args: argparse.Namespace, extra: Sequence[str]) -> Table1Plan:
    if args.limit <= 0 or (args.concurrency is not None and args.concurrency <= 0):
        raise Table1Error("--limit and --concurrency must be positive")
    if "mur" not in args.gates:
        raise Table1Error(f"--gates {','.join(args.gates)}: the random phase needs mur")
    unknown = [s for s in (*args.strategies, *(args.sweep_strategies or ())) if s not in STRATEGIES]
    if unknown:
        raise Table1Error(
            f"unknown strategy {', '.join(unknown)}: choose from {', '.join(STRATEGIES)}"
        )
    try:
        dataset = check_dataset(args.dataset).name
    except ValueError as exc:
        raise Table1Error(str(exc)) from None
    concurrency = ["--concurrency", str(args.concurrency)] if args.concurrency else []
    run_args = [*concurrency, *connection_argv(args)]
    return Table1Plan(
        strategies=args.strategies,
        dataset=dataset,
        limit=args.limit,
        gamma=args.gamma,
        sweep=args.sweep,
        sweep_strategies=args.sweep_strategies or args.strategies[:1],
        results=args.results,
        tag=args.tag or _default_tag(args.profile),
        run_args=(*run_args, *extra),
        main_gates=args.gates,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    args = build_parser().parse_args(own)
    try:
        return run_table(make_plan(args, extra), dry_run=args.dry_run)
    except (Table1Error, ServerError) as exc:
        print(f"experiments.table1: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nexperiments.table1: interrupted; rerun the same command to go on", file=sys.stderr)
        return STOPPED_EXIT


if __name__ == "__main__":
    sys.exit(main())
