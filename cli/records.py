"""`mur records`: maintain a run folder's records (evals.harness.records keeps them).

mur records drop DIR --gate LABEL   # every run of one gate, so a rerun records them again
mur records pack DIR                # the plain records into the packed volumes now
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.cli.args import OneLineParser
from mur.evals.harness.records import (
    RECORDS,
    VOLUME_AT,
    CorruptRecordsError,
    RecordStore,
    has_records,
)


def main(argv: Sequence[str] | None = None, prog: str = "mur records") -> int:
    """`mur records drop DIR --gate LABEL` and `mur records pack DIR`."""
    parser = OneLineParser(
        prog=prog,
        description="Maintain a run folder's records. drop: remove every run of one gate label "
        "(runs a since-fixed bug made), so that rerunning the folder's command.txt records "
        "them again. pack: move its plain records into the packed volumes now.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    drop = commands.add_parser("drop", help="remove every run of one gate label")
    drop.add_argument("folder", type=Path)
    drop.add_argument("--gate", required=True, help="the label as recorded, e.g. random@0.218")
    pack = commands.add_parser(
        "pack",
        help=f"move plain records into records*.jsonl.gz now, each volume under about "
        f"{VOLUME_AT / 1e6:.1f} MB (a folder packed before volumes existed is split)",
    )
    pack.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if not has_records(args.folder):
        print(f"{prog}: error: no {RECORDS} in {args.folder}: not a run folder", file=sys.stderr)
        return 2
    try:
        return _maintain(args, prog)
    except CorruptRecordsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def _maintain(args: argparse.Namespace, prog: str) -> int:
    store = RecordStore(args.folder)
    if args.command == "pack":
        store.pack()
        sizes = [path.stat().st_size for path in store.volume_paths()]
        volumes = f"{len(sizes)} volume{'s' if len(sizes) != 1 else ''}"
        print(f"{args.folder}: {len(store.load())} records in {volumes} of "
              f"{', '.join(f'{size / 1e6:.2f}' for size in sizes)} MB")  # fmt: skip
        return 0
    gates = sorted({record["gate"] for record in store.load()})
    if args.gate not in gates:  # refused before drop() packs anything
        print(
            f"{prog}: error: {args.folder} has no runs of gate {args.gate!r} (its gates: "
            f"{', '.join(gates)})",
            file=sys.stderr,
        )
        return 2
    dropped = store.drop(args.gate)
    print(f"dropped {dropped} runs of {args.gate} from {args.folder}; rerun its command.txt "
          "to record them again")  # fmt: skip
    return 0
