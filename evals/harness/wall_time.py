"""The runs `mur bench trace_time` times, as its --out file keeps them: one question solved
alone by one arm. A record format, so it sits with the run records, below the benchmark that
writes it and the experiment reports that show the wait of their arms from it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Timed:
    """One question solved alone by one arm."""

    arm: str
    problem_id: str
    wall_s: float
    tokens: int
    """Completion tokens by the graph's usage."""
    server_tokens: int
    """What the server's counter moved by meanwhile (the same: `solve_alone` checks it)."""
    prompt_tokens: int
    """The prompt tokens the server processed meanwhile (a branch sends its parent's steps)."""
    traces: int
    branched: int
    finished_s: list[float]
    """When each trace (by index) finished, in seconds from the question's start."""


def read(out: Path) -> tuple[dict[str, Any], list[Timed]]:
    """An --out file and its runs; ValueError naming the file when it is not such a result."""
    try:
        document = json.loads(out.read_text())
        return document, [Timed(**run) for run in document["runs"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{out} is not a trace_time result ({exc}): give another --out") from None


def paired(runs: Sequence[Timed], arms: Sequence[str]) -> list[Timed]:
    """The runs of the questions every arm timed: a ratio of means over other questions would
    compare easy questions with hard ones (a stopped run leaves a question part-timed)."""
    timed_by = {arm: {r.problem_id for r in runs if r.arm == arm} for arm in arms}
    every = set.intersection(*timed_by.values()) if timed_by else set()
    return [r for r in runs if r.arm in timed_by and r.problem_id in every]
