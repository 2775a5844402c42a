"""`mur report`: a run folder's tables and plots again from its records, and the hypotheses of
the pre-registered experiment it belongs to (experiments/registry.py), by name.

    mur report DIR [--prereg NAME] [--live ARM=DIR ...] [--predicted-by DIR]
    mur report DIR DIR ... --out DIR

The report itself is evals.report.tables.write_report; this command chooses the experiment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.cli.args import OneLineParser, entry_of, positive_float, positive_int
from mur.evals.report import stats
from mur.evals.report.headlines import HEADLINE_GAMMA
from mur.evals.report.tables import write_report
from mur.experiments import online_check
from mur.experiments.registry import EXPERIMENTS

PROG = "mur report"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Tables and plots from a run's records.")
    parser.add_argument(
        "run_dirs",
        nargs="*",
        metavar="run_dir",
        help="a folder of records (mur solve --out); several, with --out, combine (an "
        "experiment that names its folders takes them as --live NAME=DIR instead)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="with several folders: where the combined report.md and plots go",
    )
    parser.add_argument(
        "--headline-gamma",
        type=positive_float,
        default=HEADLINE_GAMMA,
        help="the MUR gamma the headline compares with always (default 0.9, the paper's)",
    )
    parser.add_argument(
        "--resamples", type=positive_int, default=stats.RESAMPLES, help="bootstrap resamples"
    )
    parser.add_argument("--seed", type=int, default=stats.SEED, help="bootstrap seed")
    parser.add_argument(
        "--predicted-by",
        type=Path,
        metavar="DIR",
        help="the online check (experiments/online_check.py): run_dir holds a live run of one "
        "trace rule, DIR the same questions' recorded traces; the report adds whether the live "
        "accuracy and tokens fall where replaying the rule on DIR predicts",
    )
    parser.add_argument(
        "--prereg",
        type=entry_of(EXPERIMENTS),
        metavar="NAME",
        help="the pre-registered experiment whose hypotheses to decide (default: the first "
        "that reads what the records are: a folder of traces, or several folders combined); "
        + EXPERIMENTS.describe(),
    )
    parser.add_argument(
        "--live",
        type=_named_folder,
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a folder of traces: a live run of a trace rule on (some of) its questions, shown "
        "beside the replayed rules against majority@K; the experiment reads its arms by name ("
        + "; ".join(f"{e.name}: {', '.join(e.arms)}" for e in EXPERIMENTS.values() if e.arms)
        + ")",
    )
    return parser


def _named_folder(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, Path(folder)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Write and print the report of one folder (or of several, combined into --out)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    names = [name for name, _ in args.live]
    if repeated := sorted({n for n in names if names.count(n) > 1}):
        parser.error(f"--live names each arm once: {', '.join(repeated)} given twice")
    if not args.run_dirs and not (args.live and args.out):
        parser.error("give a run folder, or an experiment's folders as --live NAME=DIR with --out")
    if len(args.run_dirs) > 1 and args.out is None:
        parser.error("several folders combine into one report: name it with --out DIR")
    combined = len(args.run_dirs) > 1 or args.out is not None
    try:
        report = write_report(
            args.out if combined else args.run_dirs[0],
            experiments=[args.prereg] if args.prereg else list(EXPERIMENTS.values()),
            headline_gamma=args.headline_gamma,
            resamples=args.resamples,
            seed=args.seed,
            sources=args.run_dirs if combined else (),
            live=dict(args.live),
            appendices=[online_check.against(args.predicted_by)] if args.predicted_by else [],
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(report.markdown)
    written = [
        report.markdown_path,
        report.json_path,
        report.plot_path,
        report.sweep_path,
        report.traces_plot_path,
    ]
    print("written: " + ", ".join(str(p) for p in written if p), file=sys.stderr)
    return 0
