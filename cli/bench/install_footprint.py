"""`mur bench install`: its command line; building, installing, measuring and the table are
benchmarks/install_footprint.py's."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from mur.benchmarks import install_footprint as footprint
from mur.cli.args import OneLineParser, comma_list, positive_int, usage_error

PROG = "mur bench install"


def install(word: str) -> tuple[str, ...]:
    """An install's extras: `base` (none), an extra, or extras joined by `+`."""
    extras = tuple(e.strip() for e in word.split("+") if e.strip() and e.strip() != "base")
    if not all(e.replace("-", "").replace("_", "").isalnum() for e in extras):
        raise argparse.ArgumentTypeError(f"{word!r} is not an extra's name")
    return extras


INSTALLS = comma_list(install, "installs such as base,serve,lab")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=(footprint.__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument(
        "--installs", type=INSTALLS, default=INSTALLS("base,serve,lab"),
        help="comma list of installs: base, an extra, or extras joined by + (serve+lab)",
    )  # fmt: skip
    parser.add_argument("--rev", help="measure this git revision instead of the working tree")
    parser.add_argument(
        "--before", metavar="REV", help="also measure this git revision (e.g. HEAD), alongside"
    )
    parser.add_argument(
        "--source", type=Path, default=footprint.ROOT, help="the checkout (default: this)"
    )
    parser.add_argument("--runs", type=positive_int, default=5, help="timed imports per install")
    parser.add_argument("--largest", type=positive_int, default=5, help="largest packages named")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--keep", action="store_true", help="keep the venvs (path on stderr)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Measure every install and print the table; 1 with one line when a step fails."""
    args = build_parser(prog).parse_args(argv)
    command = shlex.join([*prog.split(), *(sys.argv[1:] if argv is None else argv)])
    if not (args.source / "pyproject.toml").is_file():
        return usage_error(prog, f"{args.source} holds no pyproject.toml: give --source")
    work = Path(tempfile.mkdtemp(prefix="install-footprint-"))
    try:
        lines = footprint.header(args, command)
        footprints = footprint.measure_all(args, work)
        timed = next((f.load for f in footprints if f.load), "-")
        lines.append(f"- Load average when the imports were timed (round robin): {timed}")
    except (footprint.FootprintError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    table = footprint.table(footprints)
    print("\n".join([*lines, "", table, "", *footprint.details(footprints, args.largest)]))
    if args.json:
        out = {"header": lines, "installs": [asdict(f) for f in footprints]}
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
