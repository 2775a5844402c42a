"""`mur COMMAND ...`: find the subcommand in the registry and run its module's main.

No argparse parser at this level: each subcommand's parser sees every word after its name,
`--help` included, so this level only lists the commands and refuses an unknown one. It
imports nothing heavy, so `mur --help` answers at once.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import import_module

from mur.cli.args import usage_error
from mur.cli.registry import MUR, Command
from mur.nodes.extras import MissingExtra, require

HELP_FLAGS = ("-h", "--help")
MISSING_EXTRA_EXIT = 1


def main(argv: Sequence[str] | None = None) -> int:
    """The `mur` console script (pyproject.toml [project.scripts]) and `python -m mur`."""
    return dispatch(MUR, list(sys.argv[1:] if argv is None else argv), MUR.name)


def dispatch(group: Command, argv: list[str], prog: str) -> int:
    """Run the command `argv` names under `group` (`prog`: the words typed so far)."""
    if not argv or argv[0] in HELP_FLAGS:
        print(help_text(group, prog))
        return 0
    name, rest = argv[0], argv[1:]
    command = group.find(name)
    if command is None:
        return _unknown(group, name, prog)
    if command.commands:
        return dispatch(command, rest, f"{prog} {name}")
    prog = f"{prog} {name}"
    try:
        if command.extra:
            require(command.extra, "this command")
        main = import_module(command.module).main
        status: int = main(rest, prog=prog)
    except MissingExtra as exc:  # the command's own, or one of its features' (solve --dataset)
        print(f"{prog}: {exc}", file=sys.stderr)
        return MISSING_EXTRA_EXIT
    return status


def help_text(group: Command, prog: str) -> str:
    """The group's usage line and every command under it, each with its one line of help."""
    leaves = [leaf for command in group.commands for leaf in command.leaves()]
    width = max(len(words) for words, _ in leaves) + 2
    lines = [f"  {words:<{width}}{command.help}" for words, command in leaves]
    return "\n".join(
        [
            f"usage: {prog} <command> [arguments]",
            "",
            f"{group.help}.",
            "",
            "commands:",
            *lines,
            "",
            f"`{prog} <command> --help` shows a command's own arguments.",
        ]
    )


def _unknown(group: Command, name: str, prog: str) -> int:
    """One line naming the word and the commands there are; exit status 2."""
    choices = ", ".join(command.name for command in group.commands)
    if name.startswith("-"):
        solve = f" (`{prog} solve {name} ...` solves a question)" * (group is MUR)
        return usage_error(
            prog, f"unknown option {name!r}: options go after a command{solve}; commands: {choices}"
        )
    return usage_error(prog, f"unknown command {name!r}: choose one of {choices}")
