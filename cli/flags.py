"""The solve command's settings flags, made from `graphs.Context` and read back into one.

Each Context field becomes a flag of its name (`max_step_tokens` -> --max-step-tokens) with
its type, bounds, choices and description, so a new setting needs no command-line code. Unset
flags stay None and leave the field's default to Context.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any

from pydantic.fields import FieldInfo

from mur.cli.args import comma_list
from mur.graphs.state import Context, context_for
from mur.nodes.gate_labels import budget_label

# Context fields that take a comma-separated list with --dataset: the evaluation sweeps them.
SWEEPS: tuple[str, ...] = ("gate", "gamma", "budget_tokens", "target_scale_rate")
# Context fields every command names itself (required flags, kept apart from the shared settings).
CHOSEN: tuple[str, ...] = ("strategy",)
# What a flag takes beyond its Context field (nodes.gate_labels.parse_gate_label reads the labels).
FLAG_NOTES: dict[str, str] = {
    "gate": "Labels: mur+bc = mur with bias correction, random@0.12 = random at that rate, "
    "mur[budget=800] / mur[rate=0.2] = budget mode (as --budget-tokens / --target-scale-rate).",
}


def _flag_kind(annotation: Any) -> tuple[type, tuple[Any, ...] | None]:
    """The argparse type of a Context field, and its choices when it is a Literal."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_kind(args[0])  # `int | None`: the flag gives an int
    if typing.get_origin(annotation) is typing.Literal:
        return type(args[0]), tuple(args)
    return annotation, None


def add_context_flags(parser: argparse.ArgumentParser, only: Collection[str] | None = None) -> None:
    """One flag per Context field (or per field in `only`), named after it (`max_step_tokens`
    -> --max-step-tokens), typed, bounded and described by the field; unset flags stay None."""
    group = parser.add_argument_group("settings (graphs.Context; default: the paper's)")
    for name, info in Context.model_fields.items():
        if only is not None and name not in only:
            continue
        flag = "--" + name.replace("_", "-")
        kind, choices = _flag_kind(info.annotation)
        help_text = _help(name, info, choices, sweep=name in SWEEPS)
        if kind is bool:
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif name in SWEEPS:
            group.add_argument(
                flag, dest=name, type=comma_list(kind), metavar=name.upper(), help=help_text
            )
        else:
            # no argparse choices: Context refuses a bad name with the names (one error)
            group.add_argument(flag, dest=name, type=kind, required=name in CHOSEN, help=help_text)


def _help(name: str, info: FieldInfo, choices: tuple[Any, ...] | None, sweep: bool) -> str:
    """The field's description, then its choices or bounds and its default."""
    text = (info.description or "").replace("%", "%%")
    if name in FLAG_NOTES:
        text += " " + FLAG_NOTES[name]
    if sweep:
        text += " A comma list with --dataset."
    limits = [
        f"{symbol} {getattr(rule, attr)}"
        for rule in info.metadata
        for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
        if hasattr(rule, attr)
    ]
    if choices:
        limits = [f"one of {', '.join(map(str, choices))}"]
    default = "required" if name in CHOSEN else f"default {info.default}"
    return f"{text} ({'; '.join([*limits, default])})"


def flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Context settings given on the command line, but the swept and chosen ones."""
    return {
        name: getattr(args, name)
        for name in Context.field_names()
        if name not in (*SWEEPS, *CHOSEN) and getattr(args, name) is not None
    }


def shared_settings(args: argparse.Namespace, recommended: Mapping[str, Any]) -> dict[str, Any]:
    """A profile's recommendations (those that are Context fields), then the flags."""
    names = set(Context.field_names())
    return {**{k: v for k, v in recommended.items() if k in names}, **flag_settings(args)}


def gates(args: argparse.Namespace) -> list[str]:
    """The --gate labels given, else Context's default gate."""
    return list(args.gate or [Context.model_fields["gate"].default])


def gammas(args: argparse.Namespace) -> list[float]:
    """The --gamma values given, else Context's default gamma."""
    return list(args.gamma or [Context.model_fields["gamma"].default])


def budget_settings(args: argparse.Namespace) -> list[tuple[str, float]]:
    """Budget-mode variants asked for on the command line."""
    return [("budget_tokens", b) for b in args.budget_tokens or []] + [
        ("target_scale_rate", r) for r in args.target_scale_rate or []
    ]


def budget_labels(args: argparse.Namespace) -> list[str]:
    """The budget-mode variants as the gate labels their records carry (`mur[budget=300]`)."""
    return [budget_label(name, value) for name, value in budget_settings(args)]


def single_context(args: argparse.Namespace, recommended: Mapping[str, Any]) -> Context:
    """The Context of a single solve (no lists: validation refused them): a budget makes it
    the mur gate; a gate label brings its own settings (`mur+bc`, `random@0.12`)."""
    label = (budget_labels(args) or gates(args))[0]
    settings = {**shared_settings(args, recommended), "strategy": args.strategy}
    return context_for(label, settings, gamma=gammas(args)[0])
