"""The command line: `mur` and its subcommands (registry.py), `mur solve`'s room (flags from
Context, validation, the step printer, the checkpointed solve, the evaluation command), and
run.py's entry point over it.

Import light: `mur --help` loads this package and the registry only.
"""

from mur.cli.dispatch import main

__all__ = ["main"]
