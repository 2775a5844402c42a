"""The refine strategies: what "scale this step" means. This registry is their only list.

Adding a strategy: write `graphs/refine/<name>.py` (its `RefineRecord`, its scratch state, a
`Scratch` with its own keys, its nodes as methods of a `StrategyNodes` subclass whose `wire`
adds them to the subgraph, those that ask a model with `kit.add_model_node`, and
`STRATEGY = Strategy("<name>", <Scratch>, <Nodes>, <Record>, <description>)`:
graphs/refine/kit.py), then import it and list it below. The choices of `Context.strategy`
(and so of `mur solve --strategy`), the endpoint's model names and the subgraphs mounted in
the one graph that Studio draws all follow from this list (nodes.registry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mur.graphs.refine import best_of_n, critic, escalate, foresight, thinking
from mur.graphs.refine.base import RefineRecord
from mur.graphs.refine.kit import Kit, Strategy
from mur.nodes.registry import Registry

STRATEGIES: Registry[Strategy] = Registry(
    "strategy",
    *(module.STRATEGY for module in (critic, best_of_n, foresight, thinking, escalate)),
)


def summarise(record: Mapping[str, Any] | None) -> str:
    """A refine record's few words (`revised`, `chose 2 of 4`, ...), '' for none."""
    if not record:
        return ""
    if record.get("context_length"):  # the graph kept the draft: the context was full
        return "no room left in the context, draft kept"
    return STRATEGIES[record["strategy"]].summarise(record)


__all__ = ["STRATEGIES", "Kit", "RefineRecord", "Strategy", "summarise"]
