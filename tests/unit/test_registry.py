"""Every list of named rules is a nodes.registry.Registry: an unknown name gets the same one
line listing the names, from the registry and from Context alike, and Context's choices (hence
the CLI's, the endpoint's and Studio's) and help are the registry's."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from mur.graphs.refine import STRATEGIES
from mur.graphs.state import Context, ContextError
from mur.nodes.branching import BRANCH_RULES
from mur.nodes.gates import GATES
from mur.nodes.registry import Registry
from mur.nodes.settling import SETTLE_RULES
from mur.nodes.trace_stop import STOP_RULES
from mur.nodes.voting import VOTES

BY_FIELD: dict[str, tuple[Registry[Any], str]] = {
    "strategy": (STRATEGIES, "strategy"),
    "gate": (GATES, "gate"),
    "vote": (VOTES, "vote"),
    "settle": (SETTLE_RULES, "settle rule"),
    "trace_stop": (STOP_RULES, "stop rule"),
    "branch": (BRANCH_RULES, "branch rule"),
}


@pytest.mark.parametrize("field", list(BY_FIELD))
def test_an_unknown_name_gets_one_line_listing_the_names(field: str) -> None:
    registry, noun = BY_FIELD[field]
    line = f"unknown {noun} 'x': choose one of {', '.join(registry.names)}"
    with pytest.raises(ValueError) as by_registry:
        registry["x"]
    with pytest.raises(ContextError) as by_context:
        Context(**{field: "x"})
    assert str(by_registry.value) == str(by_context.value) == line
    assert by_context.value.errors[0]["loc"] == (field,)


@pytest.mark.parametrize("field", list(BY_FIELD))
def test_context_offers_the_registry_names_and_describes_them(field: str) -> None:
    registry, _ = BY_FIELD[field]
    info = Context.model_fields[field]
    assert get_args(info.annotation) == registry.names == tuple(registry)
    assert info.default in registry and len(registry) == len(list(registry.values()))
    for name in registry:
        assert f"{name}: {registry[name].description}" in (info.description or "")
    assert Context(**{field: registry.names[-1]}, **_needs(field)).model_dump()[field] in registry


def _needs(field: str) -> dict[str, Any]:
    """What the last name of each registry needs besides (batches, token logprobs)."""
    return {"traces": 4, "trace_batch": 2, "top_logprobs": 20} if field != "strategy" else {}


def test_a_literal_field_outside_the_registries_is_refused_in_the_same_words() -> None:
    with pytest.raises(ContextError, match=r"^unknown step_format 'x': choose one of marker, "):
        Context(step_format="x")
