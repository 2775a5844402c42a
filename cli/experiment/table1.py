"""`mur experiment table1`: its command line, and the flags turned into the table's plan; the
phases, their progress and the `mur solve` commands are experiments/table1.py's."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from mur.cli.args import OneLineParser, comma_list, entry_of, positive_int
from mur.cli.connection import add_connection_arguments, connection_argv
from mur.evals.harness.records import CorruptRecordsError
from mur.evals.harness.shutdown import STOPPED_EXIT
from mur.evals.questions import DATA_DIR_ENV, DATASETS, PUBLIC_DATASETS, check_dataset
from mur.experiments.presets import PRESETS, DatasetRun, Preset
from mur.experiments.table1 import (
    COMMAND,
    DEFAULT_STRATEGIES,
    DEFAULT_SWEEP,
    Table1Error,
    Table1Plan,
    run_table,
)
from mur.graphs.refine import STRATEGIES
from mur.graphs.state import context_for
from mur.nodes.gate_labels import STANDARD_LABELS
from mur.servers.clients.errors import ServerError
from mur.servers.processes.profiles import DEFAULT_PROFILE, get_profile

PROG = "mur experiment table1"


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
    """The flags (over a preset's) as the table's plan, `extra` going to every `mur solve`;
    raises Table1Error naming the flag at fault, before any phase runs or is printed."""
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
