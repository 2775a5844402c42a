"""An evaluation, typed: which questions, which settings (gate label x gamma x budget x sample),
and the Context and record key of each run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from mur.evals.harness.run_record import JobKey
from mur.evals.questions import Problem
from mur.graphs.state import Context, context_for
from mur.nodes.gate_labels import budget_label, reads_gamma


@dataclass(frozen=True)
class Job:
    key: JobKey
    problem: Problem
    context: Context


Budget = tuple[str, float]  # ("budget_tokens" | "target_scale_rate", value)
Variant = tuple[str, float | None]  # gate label, gamma (None: the label does not read it)


def model_name(model: BaseChatModel) -> str:
    """The served model name a chat model asks for (its class name when it has none)."""
    return str(getattr(model, "model_name", None) or type(model).__name__)


def gate_variants(labels: Sequence[str], gammas: Sequence[float]) -> list[Variant]:
    """The settings gate labels ask for: a label that reads gamma once per gamma, the others
    (budget mode included: its gamma adapts) once, their gamma None."""
    return [
        (label, gamma) for label in labels for gamma in (gammas if reads_gamma(label) else [None])
    ]


@dataclass(frozen=True)
class EvaluationPlan:
    """One evaluation, typed: every (gate, gamma, budget, sample) on the same questions.

    `gates` are gate labels (`mur`, `mur+bc`, `random@0.12`, see `parse_gate_label`).
    `settings` are the Context fields shared by every run (a profile's recommendations, then
    the command line's); each run adds its gate, gamma, its label's or budget's overrides, and
    `seed + sample`.
    """

    dataset: str
    strategy: str
    problems: tuple[Problem, ...]
    gates: tuple[str, ...] = ("mur",)
    gammas: tuple[float, ...] = (0.9,)
    budgets: tuple[Budget, ...] = ()
    samples: int = 1
    concurrency: int | None = None  # None: chosen by measuring the servers (harness.provenance)
    allow_mixed_servers: bool = False  # resume on a server whose tokens differ, recording it
    settings: Mapping[str, Any] = field(default_factory=dict)
    out: Path | None = None  # default runs/<dataset>-<strategy>
    command: str = ""  # the command line that asked for it, kept in command.txt

    @property
    def folder(self) -> Path:
        return self.out or Path(f"runs/{self.dataset}-{self.strategy}")

    def folder_settings(self, backbone: BaseChatModel, verifier: BaseChatModel) -> dict[str, Any]:
        """What every run in the folder shares, as settings.json records it: the models and
        each Context field but the swept gate and gamma (label and budget overrides come on top
        per run). `RecordStore.check_settings` compares it with the folder's and writes it."""
        shared = Context(**self.settings).model_dump(
            mode="json", exclude={"strategy", "gate", "gamma"}
        )
        return {
            "backbone_model": model_name(backbone),
            "verifier_model": model_name(verifier),
            **shared,
        }

    def context(self, label: str, gamma: float | None, sample: int = 0) -> Context:
        """The Context of one run: label `label` at `gamma` (None: the plan's first, which a
        gamma-blind gate never reads), seeded `seed + sample`."""
        settings = {
            **self.settings,
            "strategy": self.strategy,
            "seed": self.settings.get("seed", 0) + sample,
        }
        return context_for(label, settings, gamma=self.gammas[0] if gamma is None else gamma)

    def labels(self) -> list[str]:
        """The gate labels, then each budget-mode variant as a label of its own
        (`mur[budget=B]`, `mur[rate=r]`)."""
        return [*self.gates, *(budget_label(name, value) for name, value in self.budgets)]

    def jobs(self) -> list[Job]:
        """The cross product, with gamma-blind labels run once (their gamma recorded as
        None)."""
        variants = gate_variants(self.labels(), self.gammas)
        return [
            Job(
                JobKey(problem.dataset, problem.id, self.strategy, label, gamma, sample),
                problem,
                self.context(label, gamma, sample),
            )
            for problem in self.problems
            for label, gamma in variants
            for sample in range(self.samples)
        ]
