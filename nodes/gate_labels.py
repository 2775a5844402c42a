"""Gate labels: how `--gate`, benchmark records and report tables name a gated setting.

One benchmark folder holds every row of the paper's table, so a label carries the gate and
the settings that make the row: `mur`, `mur+bc` (bias correction), `random@0.12` (the random
gate at a rate, e.g. MUR's measured scaled rate), `mur[budget=800]` and `mur[rate=0.2]`
(budget mode). The CLI, the runner and the reports all read labels here; this module is pure
and light, so reading records never imports a model client.
"""

from __future__ import annotations

from typing import Any

from mur.nodes.gates import GAMMA_GATES, GATES

#: Every gate in its standard settings, as labels, from the gates' registry (never, always, mur
#: with and without bias correction, average, smart: the rows of the paper's table).
STANDARD_LABELS: tuple[str, ...] = tuple(label for gate in GATES.values() for label in gate.labels)

# Budget-mode Context fields and how a label names them.
BUDGET_LABELS = {"budget_tokens": "budget", "target_scale_rate": "rate"}
_BUDGET_FIELDS = {short: name for name, short in BUDGET_LABELS.items()}


def budget_label(name: str, value: float) -> str:
    """`("budget_tokens", 800)` -> `mur[budget=800]`: a budget-mode run of the mur gate.
    12 significant digits, so the label reads back the value it names (the runner runs what
    the label says)."""
    return f"mur[{BUDGET_LABELS[name]}={value:.12g}]"


def parse_gate_label(label: str) -> tuple[str, dict[str, Any]]:
    """A gate label -> (gate, Context overrides):
    `mur` -> ("mur", {}); `mur+bc` -> ("mur", {"bias_correction": True});
    `random@0.12` -> ("random", {"random_rate": 0.12});
    `mur[budget=800]` -> ("mur", {"budget_tokens": 800}).
    The gate name itself is checked by Context. Raises ValueError naming the label when its
    form is none of these."""
    if label.endswith("+bc"):
        return label.removesuffix("+bc"), {"bias_correction": True}
    if label.endswith("]") and "[" in label:
        return _parse_budget(label)
    gate, at, rate = label.partition("@")
    if not at:
        return label, {}
    if gate != "random":
        raise ValueError(f"gate label {label!r}: only random takes a rate (random@0.12)")
    return gate, {"random_rate": _number(label, rate)}


def _parse_budget(label: str) -> tuple[str, dict[str, Any]]:
    gate, _, inner = label.removesuffix("]").partition("[")
    short, _, value = inner.partition("=")
    if gate != "mur" or short not in _BUDGET_FIELDS:
        raise ValueError(
            f"gate label {label!r}: budget mode is mur[budget=<tokens>] or mur[rate=<share>]"
        )
    name, number = _BUDGET_FIELDS[short], _number(label, value)
    if name == "budget_tokens":
        if not number.is_integer():
            raise ValueError(f"gate label {label!r}: a token budget is a whole number")
        return gate, {name: int(number)}
    return gate, {name: number}


def _number(label: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"gate label {label!r}: {text!r} is not a number") from None


def is_budget_label(label: str) -> bool:
    """Whether the label names a budget-mode run (its gamma adapts, so it runs once)."""
    return any(name in BUDGET_LABELS for name in parse_gate_label(label)[1])


def reads_gamma(label: str) -> bool:
    """Whether the setting a label names decides by gamma, so a gamma sweep runs it once per
    gamma: a gamma gate, but not in budget mode (its threshold adapts instead)."""
    return parse_gate_label(label)[0] in GAMMA_GATES and not is_budget_label(label)


def gate_family(label: str) -> str:
    """`mur+bc` -> mur, `random@0.12` -> random, `mur[budget=80]` -> mur."""
    return parse_gate_label(label)[0]


def random_rate(label: str) -> float | None:
    """`random@0.218` -> 0.218; None for any other label."""
    return parse_gate_label(label)[1].get("random_rate")
