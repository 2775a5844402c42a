"""The argument parser every command line of the project uses (`mur` and each of its
subcommands, `mur servers` among them, and run.py).

argparse answers a bad flag with its whole usage block (dozens of lines for `mur solve`) before
the one line that says what is wrong. Here a usage error is that one line, `PROG: error: WHAT; see
--help`, and exit status 2, for subcommands too. It lives in cli/ with the commands that use it:
no room below parses a command line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Collection
from typing import Any, NoReturn, Protocol, TypeVar

USAGE_EXIT = 2  # argparse's own status for a usage error
MAX_PORT = 65535  # the highest TCP port
Number = TypeVar("Number", int, float)
Item = TypeVar("Item")
Entry = TypeVar("Entry", covariant=True)


class Named(Protocol[Entry]):
    def __getitem__(self, name: str, /) -> Entry: ...


class OneLineParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, usage_line(self.prog, message) + "\n")

    def add_subparsers(self, **kwargs: Any) -> Any:
        """Subcommands parse with this class as well, so their errors are one line too."""
        kwargs.setdefault("parser_class", type(self))
        return super().add_subparsers(**kwargs)


def usage_line(prog: str, message: str) -> str:
    """`PROG: error: WHAT; see --help`, on one line whatever line breaks `message` holds."""
    reason = " ".join(str(message).split())
    return f"{prog}: error: {reason}; see --help"


def usage_error(prog: str, message: str) -> int:
    """Report a usage error found after parsing (a bad value) as the parser would: one line
    on stderr, ending `; see --help`; returns the exit status to give."""
    print(usage_line(prog, message), file=sys.stderr)
    return USAGE_EXIT


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a bad value is the parser's one-line error)."""
    return _positive(text, int, "an integer")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _positive(text, float, "a number")


def port_number(text: str) -> int:
    """argparse type: a TCP port to listen on, 1 to 65535 (a bad value is the parser's
    one-line error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-{MAX_PORT})") from None
    if not 0 < value <= MAX_PORT:
        raise argparse.ArgumentTypeError(
            f"{text} is not a port number: give one from 1 to {MAX_PORT}"
        )
    return value


def port_or_any(text: str) -> int:
    """argparse type: a TCP port to listen on, or 0 for any free one the system picks."""
    return 0 if text.strip() == "0" else port_number(text)


def _positive(text: str, kind: Callable[[str], Number], noun: str) -> Number:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def comma_list(
    kind: Callable[[str], Item], noun: str = "", *, empty: bool = False
) -> Callable[[str], tuple[Item, ...]]:
    """argparse type: a comma list of `kind` ("0.8,0.9"), blanks dropped; an item `kind`
    refuses, or an empty list unless `empty` allows it (`--sweep ""`: none), is the parser's
    one-line error naming what was expected (`noun`, else the kind's name). Every list flag of
    the project parses with it."""
    what = noun or getattr(kind, "__name__", "values")

    def parse(text: str) -> tuple[Item, ...]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items and not empty:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        try:
            return tuple(kind(item) for item in items)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of {what}: {text!r}") from None

    return parse


def comma_choices(choices: Collection[str], noun: str) -> Callable[[str], tuple[str, ...]]:
    """argparse type: a comma list of `choices` in the given order (`--arms a,b`); anything
    else is the parser's one-line error naming the unknown ones and the choices."""

    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(part.strip() for part in text.split(",") if part.strip())
        unknown = [name for name in chosen if name not in choices]
        if unknown or not chosen:
            named = ", ".join(repr(name) for name in unknown) or repr(text)
            raise argparse.ArgumentTypeError(
                f"unknown {noun} {named}: choose one of {', '.join(choices)}"
            )
        return chosen

    return parse


def entry_of(registry: Named[Entry]) -> Callable[[str], Entry]:
    """argparse type: the entry `registry` names; an unknown name is the registry's own one
    line (a nodes.registry.Registry raises ValueError listing its names)."""

    def parse(name: str) -> Entry:
        try:
            return registry[name]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse
