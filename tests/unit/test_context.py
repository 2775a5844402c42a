"""Context is the one source of settings: bounds, choices and types live on its fields."""

from __future__ import annotations

import pytest

from fakes import FakeLogprobChat, Scripted
from mur.graphs import Context, ContextError, build_graph

BAD = {
    "gamma": [0, -1.0, float("inf"), float("nan")],
    "alpha": [0, 1, 1.5],
    "tau": [0, 1.01],
    "random_rate": [-0.1, 1.1],
    "budget_tokens": [0],
    "target_scale_rate": [-0.1, 1.5],
    "expected_steps": [0],
    "scale_cost_factor": [0, -1.0],
    "max_steps": [0],
    "max_step_tokens": [0],
    "num_candidates": [0],
    "critic_rounds": [0],
    "judge_max_tokens": [0],
    "foresight_steps": [-1],
    "thinking_budget": [0],
    "gate": ["sometimes"],
    "foresight_selection": ["best"],
    "thinking_style": ["deep"],
}


@pytest.mark.parametrize(
    ("name", "value"), [(name, value) for name, values in BAD.items() for value in values]
)
def test_a_bad_value_names_the_field_and_the_value(name: str, value: object) -> None:
    with pytest.raises(ContextError) as caught:
        Context(**{name: value})
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert message.startswith((f"{name} must ", f"unknown {name} ")) and repr(value) in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("name", "value"),
    [("gamma", "0.8"), ("max_steps", True), ("max_steps", 2.0), ("bias_correction", 1)],
)
def test_types_are_strict(name: str, value: object) -> None:
    with pytest.raises(ContextError, match=f"^{name} must be a valid"):
        Context(**{name: value})


def test_an_unknown_setting_lists_the_known_ones() -> None:
    with pytest.raises(
        ContextError, match="unknown setting gamme: choose among strategy, gate, gamma"
    ):
        Context(gamme=0.8)


def test_every_field_is_described_and_the_defaults_are_valid() -> None:
    for name, info in Context.model_fields.items():
        assert info.description, f"{name} has no description"
    assert Context() == Context(**Context().as_dict())
    assert Context.field_names() == tuple(Context().as_dict())


def test_an_int_is_a_valid_float_and_the_context_is_frozen() -> None:
    context = Context(gamma=1)
    assert context.gamma == 1.0 and isinstance(context.gamma, float)
    with pytest.raises(ValueError, match="frozen"):
        context.gamma = 2.0  # type: ignore[misc]


async def test_langgraph_validates_a_dict_context_into_a_context() -> None:
    model = FakeLogprobChat(responder=lambda m, k: Scripted(" the answer is 1.", [-0.1] * 3))
    graph = build_graph(backbone=model)
    result = await graph.ainvoke({"question": "q"}, context={"gate": "never", "max_steps": 1})
    assert result["config"] == {
        "strategy": "critic",
        **Context(gate="never", max_steps=1).as_dict(),
    }
    with pytest.raises(ContextError, match="max_steps must be greater than or equal to 1"):
        await graph.ainvoke({"question": "q"}, context={"max_steps": 0})
