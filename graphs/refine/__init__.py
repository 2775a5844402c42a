"""The refine strategies: what "scale this step" means. This registry is their only list.

Adding a strategy: write `graphs/refine/<name>.py` (its scratch state, its `RefineRecord`, a
`build(backbone, verifier, context_of)` returning the compiled subgraph, and
`STRATEGY = Strategy("<name>", build, <Record>)`), then import it and list it below.
`STRATEGIES`, `check_strategy`, run.py's `--strategy` choices, the endpoint's model names
and Studio's graphs all follow from this list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphs.refine import best_of_n, critic, foresight, thinking
from graphs.refine.base import RefineRecord, Strategy

REGISTRY: dict[str, Strategy] = {
    module.STRATEGY.name: module.STRATEGY for module in (critic, best_of_n, foresight, thinking)
}
STRATEGIES: tuple[str, ...] = tuple(REGISTRY)


def check_strategy(strategy: str) -> Strategy:
    """The registry entry of `strategy`, or a ValueError naming the valid ones."""
    if strategy not in REGISTRY:
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return REGISTRY[strategy]


def summarise(record: Mapping[str, Any] | None) -> str:
    """A refine record's few words (`revised`, `chose 2 of 4`, ...), '' for none."""
    if not record:
        return ""
    if record.get("context_length"):  # the graph kept the draft: the context was full
        return "no room left in the context, draft kept"
    return check_strategy(record["strategy"]).summarise(record)


__all__ = ["REGISTRY", "STRATEGIES", "RefineRecord", "Strategy", "check_strategy", "summarise"]
