"""Python's garbage collector kept off the heap that start-up leaves.

Importing LangChain, LangGraph, pydantic and the SDK leaves hundreds of thousands of
long-lived objects, and a run allocates fast: every reply is a tree of dicts, one per token
logprob. With the default thresholds (700, 10, 10) the collector runs every few hundred
allocations and, every hundred of those, walks the whole heap again: against a server as fast
as a GPU that was the client's largest single cost (`mur bench client`, BENCHMARKS.md).
`tune_collector()`, once start-up is done, collects once, freezes what survived (later
collections skip it) and lets the first generation grow to `FIRST_GENERATION` objects before a
collection. Reference counting still frees almost everything at once; the collector is only
for cycles, which a run makes few of.
"""

from __future__ import annotations

import gc

FIRST_GENERATION = 50_000
"""Allocations (net of frees) between two collections of the youngest generation."""
OLDER_GENERATIONS = (20, 100)
"""Collections of a generation between two of the next older one."""


def tune_collector() -> None:
    """Freeze the objects alive now and collect less often (see the module docstring).

    Called when a run starts (evals.harness.runner, the endpoint): what start-up made stays
    for the process's life. Calling it again freezes what the last run left, harmless."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(FIRST_GENERATION, *OLDER_GENERATIONS)
