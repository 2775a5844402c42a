"""Pieces shared by the commands that replay a results folder against a server
(`mur experiment verdicts`, `mur experiment rescore`)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.cli.args import comma_list

float_list = comma_list(float, "numbers")
"""An argparse type: comma-separated numbers ("0,0.5")."""


def publish(text: str, out: Path | None, prog: str, argv: Sequence[str] | None) -> None:
    """Print a tool's markdown summary and, with `out`, write it there with the command that
    made it (`prog`, e.g. `mur experiment rescore`, and its arguments), so a file in results/
    says how to make it again."""
    print(text)
    if out:
        words = sys.argv[1:] if argv is None else argv
        out.write_text(text + f"\nCommand: {prog} {shlex.join(words)}\n")
