"""Gate labels: the one parser that `--gate`, the runner and the reports read."""

from __future__ import annotations

from typing import get_args

import pytest

from mur.evals.harness.plan import EvaluationPlan
from mur.evals.questions import load_dataset
from mur.graphs import Context
from mur.graphs.state import ContextError, context_for
from mur.nodes.gate_labels import (
    STANDARD_LABELS,
    budget_label,
    gate_family,
    is_budget_label,
    parse_gate_label,
    random_rate,
    reads_gamma,
)
from mur.nodes.gates import GAMMA_GATES, GATES


@pytest.mark.parametrize(
    ("label", "gate", "overrides"),
    [
        ("mur", "mur", {}),
        ("mur+bc", "mur", {"bias_correction": True}),
        ("random@0.12", "random", {"random_rate": 0.12}),
        ("always", "always", {}),
        ("mur[budget=800]", "mur", {"budget_tokens": 800}),
        ("mur[rate=0.25]", "mur", {"target_scale_rate": 0.25}),
    ],
)
def test_gate_labels_name_a_gate_and_its_settings(label, gate, overrides) -> None:
    assert parse_gate_label(label) == (gate, overrides)
    assert gate_family(label) == gate
    Context(gate=gate, **overrides)  # every form names valid Context settings


@pytest.mark.parametrize(
    "label",
    [
        "mur@0.5",
        "random@often",
        "mur[tokens=5]",
        "never[budget=300]",
        "mur[budget=lots]",
        "mur[budget=2.5]",
    ],
)
def test_bad_gate_labels_say_what_is_wrong(label: str) -> None:
    with pytest.raises(ValueError, match=label.replace("[", r"\[")):
        parse_gate_label(label)


def test_budget_labels_read_back_what_they_name() -> None:
    for name, value in [
        ("budget_tokens", 300),
        ("target_scale_rate", 0.25),
        ("budget_tokens", 1e6),
        ("budget_tokens", 1234567),  # more digits than %g keeps: the run gets this, not 1234570
        ("target_scale_rate", 0.1234567),
    ]:
        label = budget_label(name, value)
        assert parse_gate_label(label) == ("mur", {name: value})
        assert is_budget_label(label)
    assert not is_budget_label("mur+bc")


def test_only_random_labels_carry_a_rate() -> None:
    assert random_rate("random@0.218") == 0.218
    assert random_rate("mur[rate=0.2]") is None  # a target scale rate, not the random gate's
    assert random_rate("random") is None


def test_a_budget_gate_label_runs_once_like_the_budget_flag() -> None:
    """`--gate mur[budget=300]` is the label `--budget-tokens 300` records: same jobs."""
    problems = tuple(load_dataset("math500", limit=1))
    common = {
        "dataset": "math500",
        "strategy": "critic",
        "problems": problems,
        "gammas": (0.7, 0.9),
    }
    by_flag = EvaluationPlan(**common, gates=(), budgets=(("budget_tokens", 300),)).jobs()
    by_label = EvaluationPlan(**common, gates=("mur[budget=300]",)).jobs()
    assert [(j.key, j.context) for j in by_flag] == [(j.key, j.context) for j in by_label]
    assert [j.key.gamma for j in by_label] == [None]


def test_a_label_and_settings_make_one_context() -> None:
    settings = {"max_steps": 4, "gate": "never", "gamma": 0.5}
    assert context_for("mur+bc", settings, gamma=0.8) == Context(
        gate="mur", gamma=0.8, bias_correction=True, max_steps=4
    )
    assert context_for("random@0.2", settings) == Context(
        gate="random", gamma=0.5, random_rate=0.2, max_steps=4
    )
    assert context_for("always") == Context(gate="always")
    with pytest.raises(ValueError, match=r"gate label 'mur@0\.5'"):
        context_for("mur@0.5")
    with pytest.raises(ContextError, match="max_steps"):
        context_for("mur", {"max_steps": 0})


def test_which_labels_read_gamma_and_which_are_the_papers() -> None:
    assert [label for label in STANDARD_LABELS if reads_gamma(label)] == ["mur", "mur+bc"]
    assert not reads_gamma("mur[budget=300]") and not reads_gamma("random@0.2")
    for label in STANDARD_LABELS:
        context_for(label)  # every row is a valid setting


def test_a_gate_is_one_registry_entry_and_its_facts_follow() -> None:
    """The CLI's choices, Context's type, gamma sweeps and table1's rows come from the
    registry: a gate added there is everywhere at once."""
    assert get_args(Context.model_fields["gate"].annotation) == GATES.names
    assert {"mur"} == GAMMA_GATES and reads_gamma("mur") and not reads_gamma("average")
    assert STANDARD_LABELS == ("never", "always", "mur", "mur+bc", "average", "smart")
    assert all(gate.description for gate in GATES.values())
