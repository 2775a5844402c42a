"""BENCHMARKS.md: the generated part (header, tables, goal lines) above the notes marker; the
hand-written notes below it, including how each table is measured, are kept on every rewrite."""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Any

import psutil

from mur.benchmarks.analysis import step_prompt_rows
from mur.benchmarks.measure import Settings
from mur.benchmarks.tables import (
    cache_table,
    economy_table,
    n_choice_table,
    overhead_table,
    scaling_table,
    step_table,
)
from mur.servers.processes.facts import cpu_model

NOTES_MARKER = (
    "<!-- notes: everything below this line is kept when `mur bench economy` rewrites the file -->"
)
# Up to its "when": older versions' markers named their module (evals.bench, benchmarks.bench).
_NOTES_OPENING = NOTES_MARKER.split(" when ", 1)[0]


def merge_notes(generated: str, previous: str | None) -> str:
    """The new generated text plus whatever the previous file held below `NOTES_MARKER`."""
    notes = ""
    if previous and _NOTES_OPENING in previous:
        notes = previous.split(_NOTES_OPENING, 1)[1].split("-->", 1)[1].strip("\n")
    text = generated.rstrip("\n") + f"\n\n{NOTES_MARKER}\n"
    return text + (f"\n{notes}\n" if notes else "")


def machine_line() -> str:
    mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu_model()}, {cores} cores{mem}, {platform.system()} {platform.release()}"


def load_line() -> str:
    with contextlib.suppress(OSError):
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return "-"


def render(out: dict[str, Any], settings: Settings, command: str, header: dict[str, str]) -> str:
    """The generated part of BENCHMARKS.md: what was run, on what, and the numbers."""
    economy_md, economy_goals = economy_table(out["economy"])
    overhead_md, overhead_goals = overhead_table(out["overhead"])
    scaling_md, scaling_goals = scaling_table(out["scaling"])
    mur_runs = [r for r in out["economy"] if r.gate == "mur"]
    graph = ", ".join(f"{k}={v}" for k, v in settings.graph.items())
    parts = [
        "# Benchmarks: MUR's token economy and the orchestration's speed",
        "",
        f"- Command: `{command}`",
        *(f"- {key}: {value}" for key, value in header.items()),
        f"- Graph settings: {graph}, gamma={settings.gamma}; every other setting is "
        "graphs.Context's default; the backbone is also the verifier.",
        "",
        "All numbers come from this one run; how each table is measured is in the notes below.",
        "",
        f"## 1. Token economy ({settings.questions} MATH-500 questions, "
        f"{settings.concurrency} in flight)",
        "",
        economy_md,
        "",
        *economy_goals,
        "",
        "## 2. Orchestration overhead: the graph vs a direct replay of its exact requests",
        "",
        overhead_md,
        "",
        *overhead_goals,
        "",
        "## 3. Concurrency scaling: graph tok/s vs the server's raw batched tok/s",
        "",
        f"Graph: {settings.scaling_strategy} / mur, new questions starting for "
        f"{settings.window_s:g} s at each level; raw: {settings.raw_seconds / 2:g} s before "
        f"and {settings.raw_seconds / 2:g} s after it.",
        "",
        scaling_md,
        "",
        *scaling_goals,
        "",
        "## 4. Request efficiency",
        "",
        "### 4a. N candidates: one request with n = N vs N requests (after the same draft)",
        "",
        f"{settings.n_choice_reps} questions, {settings.graph['max_step_tokens']} tokens per "
        "candidate.",
        "",
        n_choice_table(out["n_choices"]),
        "",
        "### 4b. Prefix cache during MUR runs (server counters, tokens)",
        "",
        cache_table([*mur_runs, out["sequential"]], out["block_size"]),
        "",
        "### 4c. Prompt tokens per step (step drafts, one question at a time, counters read "
        "around each request)",
        "",
        step_table(step_prompt_rows(out["sequential"].requests, out["block_size"])),
        "",
        *([f"Client profile: {out['profile']}", ""] if out.get("profile") else []),
    ]
    return "\n".join(parts)
