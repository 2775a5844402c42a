"""What `pip install mur` leaves out, and the one line that says so.

The base install runs the graph against a server (ChatMUR, mur_tool, MURMiddleware,
`mur solve` on a question); the endpoint and its database are the `serve` extra, evaluations,
reports and foresight's clustering the `lab` extra. A feature that needs an extra calls
`require(extra, feature)` before importing it, so a missing package is `MissingExtra`, one line
naming the extra to install, and never a traceback halfway through a run.
"""

from __future__ import annotations

import importlib.util

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "serve": (
        "fastapi",
        "sse_starlette",
        "starlette",
        "uvicorn",
        "langgraph.checkpoint.postgres",
        "psycopg",
        "psycopg_pool",
    ),
    "lab": ("math_verify", "pebble", "scipy", "sklearn", "matplotlib"),
}
"""The modules each extra of pyproject.toml installs (tests/unit/test_extras.py holds the two
lists to each other)."""


class MissingExtra(ImportError):
    """A feature's extra is not installed: says which, and the command that installs it."""

    def __init__(self, extra: str, feature: str, module: str) -> None:
        self.extra, self.feature = extra, feature
        super().__init__(
            f"{feature} needs the {extra!r} extra, which this install lacks (no module "
            f"{module!r}): pip install 'mur[{extra}]'",
            name=module,
        )


def require(extra: str, feature: str) -> None:
    """Raise `MissingExtra` unless every module of `extra` can be imported (found, not
    imported: the check costs no import time)."""
    if extra not in EXTRA_MODULES:
        raise ValueError(f"unknown extra {extra!r}: choose one of {', '.join(EXTRA_MODULES)}")
    for module in EXTRA_MODULES[extra]:
        if not _found(module):
            raise MissingExtra(extra, feature, module)


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package of a dotted name is missing
        return False
