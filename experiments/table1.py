"""The paper's Table 1 in miniature, as one resumable command.

    mur experiment table1 --base-url http://127.0.0.1:8022/v1 --profile cpu-qwen-1.5b
    mur experiment table1 ... --dry-run          # the mur solve commands it would run
    mur experiment table1 --preset paper-gpu     # the paper's setting (presets.py)

For each dataset and strategy, into `<results>/<dataset>-<strategy>-<tag>/`, three phases, each one
`mur solve ... --dataset` command (the `mur` console script installed with the project), so each
folder's command.txt reads like a user's:

1. main: the paper's rows (nodes.gate_labels.STANDARD_LABELS: never, always, mur, mur+bc,
   average, smart) at the dataset's gamma;
2. random: the random gate at the rate that scales as many steps as MUR did in phase 1
   (computed from its records, so phase 1 must be complete);
3. sweep (`--sweep-strategies`, default the first strategy): mur at each `--sweep` gamma.

Every (dataset, strategy)'s main phase runs before any random phase, and those before any
sweep, so a table stopped part-way holds the headline rows of every strategy first. One
dataset (`--dataset`, `--gamma`, `--limit`) or a preset's several, each with its own gamma,
questions and samples (`experiments.presets`); `--dry-run` with a preset also prints the
tokens the paper's tables lead one to expect.

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
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from mur.evals.harness.plan import gate_variants
from mur.evals.harness.records import CorruptRecordsError, records_so_far
from mur.evals.harness.run_record import RunRecord
from mur.evals.harness.shutdown import STOP_SIGNALS, STOPPED_EXIT
from mur.evals.questions import (
    DATA_DIR_ENV,
    DATASETS,
    HF_SOURCE,
    PUBLIC_DATASETS,
    DataNotFoundError,
    check_dataset,
    dataset_file,
)
from mur.evals.report.headlines import matched_random_rate
from mur.experiments.presets import PRESETS, DatasetRun, Preset, Tokens, budget_lines, run_tokens
from mur.graphs.refine import STRATEGIES
from mur.graphs.state import context_for
from mur.nodes.gate_labels import STANDARD_LABELS
from mur.servers.cli import OneLineParser, comma_list, entry_of, positive_int
from mur.servers.clients.errors import ServerError
from mur.servers.connect import add_connection_arguments, connection_argv
from mur.servers.processes.profiles import DEFAULT_PROFILE, get_profile

#: The console script (pyproject.toml, [project.scripts]) and its subcommand each phase runs:
#: what a user types.
PROGRAM = "mur"
SOLVE = "solve"
COMMAND = f"{PROGRAM} {SOLVE}"
PROG = "mur experiment table1"
DEFAULT_STRATEGIES = ("critic", "best_of_n")
#: Around gamma 0.9, where the share of steps the gate scales moves fastest on the CPU models
#: (the replayed sweep in results/README.md).
DEFAULT_SWEEP = (0.7, 0.8, 0.95)


class Table1Error(Exception):
    """A phase that cannot run yet, or a mur command that failed: one line, exit status 2."""


@dataclass(frozen=True)
class Phase:
    dataset: DatasetRun
    strategy: str
    name: str  # main | random | sweep
    folder: Path
    gates: tuple[str, ...]  # empty for random: its rate comes from the main phase's records
    gammas: tuple[float, ...]

    @property
    def runs_per_setting(self) -> int:
        return self.dataset.limit * self.dataset.samples


@dataclass(frozen=True)
class Table1Plan:
    strategies: tuple[str, ...]
    datasets: tuple[DatasetRun, ...]
    sweep: tuple[float, ...]
    sweep_strategies: tuple[str, ...]
    results: Path
    tag: str
    run_args: tuple[str, ...]  # mur flags shared by every command
    main_gates: tuple[str, ...] = STANDARD_LABELS
    data_dir: str | None = None  # for the datasets the project does not ship (GPQA)
    preset: Preset | None = None  # the preset it came from: the dry run prints its budget

    def folder(self, dataset: str, strategy: str) -> Path:
        return self.results / f"{dataset}-{strategy}-{self.tag}"

    def phases(self) -> list[Phase]:
        """Every (dataset, strategy)'s main phase first, then the random baselines, then the
        sweeps: a table stopped part-way has the headline rows of every strategy before the
        extras."""

        def phase(
            d: DatasetRun, s: str, name: str, gates: tuple[str, ...], gammas: Sequence[float] = ()
        ) -> Phase:
            return Phase(d, s, name, self.folder(d.name, s), gates, tuple(gammas))

        pairs = [(d, s) for d in self.datasets for s in self.strategies]
        main = [phase(d, s, "main", self.main_gates, (d.gamma,)) for d, s in pairs]
        random = [phase(d, s, "random", ()) for d, s in pairs]
        sweep = [
            phase(d, s, "sweep", ("mur",), self.sweep)
            for d, s in pairs
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
                matched = self.random_gate(phase, records)
            except Table1Error:
                return 0, phase.runs_per_setting  # MUR unfinished: random has not started
            return sum(1 for r in records if r["gate"] == matched), phase.runs_per_setting
        settings = gate_variants(phase.gates, phase.gammas)
        done = sum(
            1
            for r in records
            if any(r["gate"] == label and _same(r["gamma"], gamma) for label, gamma in settings)
        )
        return done, phase.runs_per_setting * len(settings)

    def random_gate(self, phase: Phase, records: Sequence[RunRecord] | None = None) -> str:
        """`random@<rate>` at MUR's measured rate: only once MUR has every question (and
        sample). ``records``: the phase folder's, when the caller has read them already."""
        records = records_so_far(phase.folder) if records is None else records
        gamma = phase.dataset.gamma
        mur = [r for r in records if r["gate"] == "mur" and _same(r["gamma"], gamma)]
        done = len({(r["problem_id"], r["sample"]) for r in mur})
        if done < phase.runs_per_setting:
            samples = phase.dataset.samples
            asked = f"{phase.dataset.limit} questions" + f" x {samples} samples" * (samples > 1)
            raise Table1Error(
                f"the random baseline needs MUR's scaled rate over all {asked}, and "
                f"{phase.folder} has MUR (gamma {gamma:g}) on {done}: the main phase has "
                "not finished (rerun this command to finish it)"
            )
        return f"random@{matched_random_rate(mur):.3g}"

    def argv(self, phase: Phase) -> list[str]:
        """The mur arguments of a phase (the random phase resolves its rate now)."""
        dataset = phase.dataset
        gates = phase.gates or (self.random_gate(phase),)
        argv = [
            "--strategy", phase.strategy,
            "--dataset", dataset.name,
            "--limit", str(dataset.limit),
            "--gate", ",".join(gates),
        ]  # fmt: skip
        if phase.gammas:
            argv += ["--gamma", ",".join(f"{g:g}" for g in phase.gammas)]
        if dataset.samples > 1:
            argv += ["--samples", str(dataset.samples)]
        if self.data_dir is not None and not check_dataset(dataset.name).public:
            argv += ["--data-dir", self.data_dir]
        return [*argv, *self.run_args, "--out", str(phase.folder)]

    def data_sources(self) -> list[str]:
        """Where each dataset the project does not ship is read from, one line each; raises
        Table1Error naming the missing file and how to point at it."""
        hub = (self.data_dir or os.environ.get(DATA_DIR_ENV, "")).strip().lower() == HF_SOURCE
        lines = []
        for name in (d.name for d in self.datasets if not check_dataset(d.name).public):
            try:
                where = "the Hugging Face hub" if hub else dataset_file(name, self.data_dir)
            except DataNotFoundError as exc:
                raise Table1Error(str(exc)) from None
            lines.append(f"{name}: read from {where}")
        return lines

    def budget(self, thinking_budget: int) -> list[str]:
        """The tokens the paper's tables lead one to expect of every phase, by dataset
        (`experiments.presets.run_tokens`), as the dry run prints them."""
        by_dataset: dict[str, tuple[int, Tokens]] = {}
        unpriced: set[str] = set()
        for phase in self.phases():
            labels = [label for label, _ in gate_variants(phase.gates, phase.gammas)]
            for label in labels or ["random"]:
                tokens = run_tokens(phase.strategy, label, thinking_budget)
                if tokens is None:
                    unpriced.add(phase.strategy)
                    continue
                runs, total = by_dataset.get(phase.dataset.name, (0, Tokens()))
                by_dataset[phase.dataset.name] = (
                    runs + phase.runs_per_setting,
                    total + tokens.times(phase.runs_per_setting),
                )
        return budget_lines(by_dataset, unpriced)


def _same(gamma: float | None, wanted: float | None) -> bool:
    """Equal gammas (None: a gamma-blind gate)."""
    if gamma is None or wanted is None:
        return gamma is wanted
    return math.isclose(gamma, wanted)


Runner = Callable[[Sequence[str]], int]


def mur_program() -> list[str]:
    """`mur solve` of the environment this runs in: the console script beside the interpreter
    (so a virtualenv need not be activated), else on the PATH."""
    beside = Path(sys.executable).with_name(PROGRAM)
    found = str(beside) if beside.is_file() else shutil.which(PROGRAM)
    if found is None:
        raise Table1Error(
            f"the {PROGRAM} command is not installed beside {sys.executable} nor on the PATH: "
            "install the project into this environment (`make setup`, or pip install -e .)"
        )
    return [found, SOLVE]


def run_mur(argv: Sequence[str], program: Sequence[str] | None = None) -> int:
    """`mur solve` (or `program`) in a child process, stopped the way `mur solve` stops
    (evals.harness.shutdown): each SIGTERM to this process goes on to it, and so does each
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


def run_table(
    plan: Table1Plan, runner: Runner = run_mur, *, dry_run: bool = False, prog: str = PROG
) -> int:
    """Run the phases in order (or, with `dry_run`, print each with its progress and
    command, where the data comes from and a preset's expected tokens); a failed mur command
    stops the table. A dataset not found stops it before anything runs."""
    if dry_run:
        try:
            sources = plan.data_sources()
        except Table1Error as exc:
            sources = [f"not found: {exc}"]
        print(*(f"# {line}" for line in sources), sep="\n", end="\n" * bool(sources))
    else:
        plan.data_sources()
    several = len(plan.datasets) > 1
    for phase in plan.phases():
        name = f"{phase.dataset.name} / " * several + f"{phase.strategy} / {phase.name}"
        done, total = plan.progress(phase)
        status = f"{name} ({done} of {total} runs recorded)"
        if dry_run:
            try:
                print(f"# {status}\n{shlex.join([PROGRAM, SOLVE, *plan.argv(phase)])}")
            except Table1Error as exc:
                print(f"# {status}: {exc}")
            continue
        argv = plan.argv(phase)
        print(f"== {status}: {shlex.join([PROGRAM, SOLVE, *argv])}", file=sys.stderr, flush=True)
        code = runner(argv)
        if code == STOPPED_EXIT:
            print(
                f"{prog}: {name} stopped; its finished questions are saved in "
                f"{phase.folder}: rerun this command to go on",
                file=sys.stderr,
            )
            return STOPPED_EXIT
        if code != 0:
            raise Table1Error(
                f"{name} stopped ({COMMAND} exit {code}); its finished questions are saved in "
                f"{phase.folder}: rerun this command to go on"
            )
    if dry_run and plan.preset is not None:
        print("\n".join(plan.budget(plan.preset.thinking_budget)))
    return 0


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="The paper's Table 1 in miniature: every strategy's gates, the random "
        f"baseline at MUR's rate and a gamma sweep, resumable ({COMMAND} skips what is done). "
        f"The server flags and the arguments after -- go to every {COMMAND} command.",
    )
    add = parser.add_argument
    unshipped = [name for name in DATASETS if name not in PUBLIC_DATASETS]
    add("--preset", type=entry_of(PRESETS), metavar="NAME", help="named settings: "
        + PRESETS.describe()
        + ". Sets the strategies, the datasets with their gammas and samples, the server "
        "profiles (and the backbone's URL, unless --base-url or MUR_BASE_URL says where) and "
        "the thinking settings; other flags still apply")  # fmt: skip
    add(
        "--strategies",
        type=comma_list(str, empty=True),
        help=f"comma list (default {','.join(DEFAULT_STRATEGIES)})",
    )
    add("--dataset", type=comma_list(str, empty=True), help=f"one of {', '.join(DATASETS)} "
        "(default math500); with --preset, the preset's datasets to run (comma list)")  # fmt: skip
    add("--limit", type=positive_int, help="first N questions (default 100; with --preset, at "
        "most N of each dataset)")  # fmt: skip
    add("--gamma", type=float, help="MUR's gamma in the main table (default 0.9)")
    add("--sweep", type=comma_list(float, empty=True), help="gammas of the sweep (default "
        f"{','.join(map(str, DEFAULT_SWEEP))}; with --preset, none)")  # fmt: skip
    add("--sweep-strategies", type=comma_list(str, empty=True), help="default: the first strategy")
    add(
        "--gates",
        type=comma_list(str, empty=True),
        default=STANDARD_LABELS,
        help="the main phase's gates",
    )
    add("--concurrency", type=positive_int, help="questions in flight (default: measured by mur)")
    add("--data-dir", help=f"where the datasets the project does not ship ({', '.join(unshipped)}) "
        f"are read from, or 'hf': passed to their {COMMAND} commands (default: ${DATA_DIR_ENV}, "
        "else ../shared/data)")  # fmt: skip
    add("--results", type=Path, default=Path("results"), help="parent of the run folders")
    add("--tag", help="folder suffix naming the model (default: from --profile)")
    add("--dry-run", action="store_true", help=f"print the {COMMAND} commands, run nothing")
    add_connection_arguments(parser)
    return parser


def _default_tag(profile: str | None) -> str:
    name = get_profile(profile or DEFAULT_PROFILE).served_model_name
    return name.lower().removesuffix("-instruct")


def _datasets(args: argparse.Namespace, preset: Preset | None) -> tuple[DatasetRun, ...]:
    """The flags' one dataset, or the preset's (those --dataset names, each at most --limit
    questions)."""
    try:
        names = [check_dataset(name).name for name in args.dataset or ()]
    except ValueError as exc:
        raise Table1Error(str(exc)) from None
    if preset is None:
        if len(names) > 1:
            raise Table1Error(f"--dataset {','.join(names)}: one dataset (several: --preset)")
        name = names[0] if names else "math500"
        gamma = 0.9 if args.gamma is None else args.gamma
        return (DatasetRun(name, 100 if args.limit is None else args.limit, gamma),)
    if args.gamma is not None:
        gammas = ", ".join(f"{d.name} {d.gamma:g}" for d in preset.datasets)
        raise Table1Error(
            f"--gamma {args.gamma:g}: the preset {preset.name} sets gamma by dataset "
            f"({gammas}); drop --gamma, or drop --preset"
        )
    outside = [name for name in names if name not in {d.name for d in preset.datasets}]
    if outside:
        raise Table1Error(
            f"--dataset {','.join(outside)}: not in the preset {preset.name} (its datasets: "
            f"{', '.join(d.name for d in preset.datasets)})"
        )
    limit = args.limit
    return tuple(
        replace(d, limit=d.limit if limit is None else min(limit, d.limit))
        for d in preset.datasets
        if not names or d.name in names
    )


def _servers(args: argparse.Namespace, preset: Preset | None) -> argparse.Namespace:
    """The server flags of every mur command: the user's, over the preset's profiles. A GPU
    profile names no server here, so the preset also gives the backbone's URL (the verifier
    profile's server is where mur looks without --verifier-url)."""
    if preset is None:
        return args
    profile = args.profile or preset.profile
    base_url = args.base_url
    if not base_url and not os.environ.get("MUR_BASE_URL", "").strip():
        base_url = get_profile(profile).base_url
    verifier_profile = args.verifier_profile or preset.verifier_profile
    return argparse.Namespace(
        **{**vars(args), "profile": profile, "base_url": base_url,
           "verifier_profile": verifier_profile}
    )  # fmt: skip


def make_plan(args: argparse.Namespace, extra: Sequence[str]) -> Table1Plan:
    preset: Preset | None = args.preset
    datasets = _datasets(args, preset)
    if "mur" not in args.gates:
        raise Table1Error(f"--gates {','.join(args.gates)}: the random phase needs mur")
    strategies = args.strategies or (preset.strategies if preset else DEFAULT_STRATEGIES)
    try:
        for strategy in (*strategies, *(args.sweep_strategies or ())):
            STRATEGIES.check(strategy)
    except ValueError as exc:  # one line naming the strategies
        raise Table1Error(str(exc)) from None
    concurrency = ["--concurrency", str(args.concurrency)] if args.concurrency else []
    servers = _servers(args, preset)
    settings = preset.mur_args() if preset else ()
    sweep = args.sweep if args.sweep is not None else () if preset else DEFAULT_SWEEP
    plan = Table1Plan(
        strategies=strategies,
        datasets=datasets,
        sweep=sweep,
        sweep_strategies=args.sweep_strategies or strategies[:1],
        results=args.results,
        tag=args.tag or _default_tag(servers.profile),
        run_args=(*concurrency, *connection_argv(servers), *settings, *extra),
        main_gates=args.gates,
        data_dir=args.data_dir,
        preset=preset,
    )
    check_settings(plan)
    return plan


def check_settings(plan: Table1Plan) -> None:
    """Refuse a gate or gamma its `mur solve` would refuse, by the same check (every gate x
    gamma through graphs.state.context_for, as cli.validation does), before any phase runs
    or is printed. Raises Table1Error naming the flag and the value at fault."""
    for phase in plan.phases():  # the random phase has no gates: the main phase's settings
        for label in phase.gates:
            try:
                context_for(label)
            except ValueError as exc:
                raise Table1Error(f"--gates {label}: {exc}") from None
            for gamma in phase.gammas:
                try:
                    context_for(label, gamma=gamma)
                except ValueError as exc:
                    flag = "--sweep" if phase.name == "sweep" else "--gamma"
                    raise Table1Error(f"{flag} {gamma:g}: {exc}") from None


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run (or --dry-run print) the table's phases; the arguments after `--` go to every
    `mur solve`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    args = build_parser(prog).parse_args(own)
    try:
        return run_table(make_plan(args, extra), dry_run=args.dry_run, prog=prog)
    except (Table1Error, ServerError, CorruptRecordsError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; rerun the same command to go on", file=sys.stderr)
        return STOPPED_EXIT


if __name__ == "__main__":
    sys.exit(main())
