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

from mur.evals.harness.plan import gate_variants
from mur.evals.harness.records import records_so_far
from mur.evals.harness.run_record import RunRecord
from mur.evals.harness.shutdown import STOP_SIGNALS, STOPPED_EXIT
from mur.evals.questions import (
    DATA_DIR_ENV,
    HF_SOURCE,
    DataNotFoundError,
    check_dataset,
    dataset_file,
)
from mur.evals.report.headlines import matched_random_rate
from mur.experiments.presets import DatasetRun, Preset, Tokens, budget_lines, run_tokens
from mur.nodes.gate_labels import STANDARD_LABELS

#: The console script (pyproject.toml, [project.scripts]) and its subcommand each phase runs:
#: what a user types.
PROGRAM = "mur"
SOLVE = "solve"
COMMAND = f"{PROGRAM} {SOLVE}"
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
    plan: Table1Plan, runner: Runner = run_mur, *, prog: str, dry_run: bool = False
) -> int:
    """Run the phases in order (or, with `dry_run`, print each with its progress and
    command, where the data comes from and a preset's expected tokens); a failed mur command
    stops the table. A dataset not found stops it before anything runs. `prog` (the command's
    name) starts the line that says how to go on after a stop."""
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
