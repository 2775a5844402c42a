"""The refine strategies: what "scale this step" means. This registry is their only list.

Adding a strategy: write `graphs/refine/<name>.py` (its `RefineRecord`, its scratch state, a
`Scratch` with its own keys, its nodes as methods of a `StrategyNodes` subclass whose `wire`
adds them to the subgraph, those that ask a model with `kit.add_model_node`, and
`STRATEGY = Strategy("<name>", <Scratch>, <Nodes>, <Record>)`: graphs/refine/kit.py), then
import it and list it below. `STRATEGIES`, `check_strategy`, the choices of
`Context.strategy` (and so of `mur solve --strategy`), the endpoint's model names and the
subgraphs mounted in the one graph that Studio draws all follow from this list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from mur.graphs.refine import best_of_n, critic, foresight, thinking
from mur.graphs.refine.base import RefineRecord
from mur.graphs.refine.kit import Kit, Strategy

REGISTRY: dict[str, Strategy] = {
    module.STRATEGY.name: module.STRATEGY for module in (critic, best_of_n, foresight, thinking)
}
STRATEGIES: tuple[str, ...] = tuple(REGISTRY)

if TYPE_CHECKING:  # the names are the registry's, known when it is built
    StrategyName = str
else:
    StrategyName = Literal[STRATEGIES]


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


__all__ = [
    "REGISTRY",
    "STRATEGIES",
    "Kit",
    "RefineRecord",
    "Strategy",
    "StrategyName",
    "check_strategy",
    "summarise",
]
