"""What every pre-registered experiment shares: the evidence a report gathers, the one
`Decision` type its tests return, and the one table that prints them. The experiments
themselves are entries in experiments/ (`tables.write_report(experiments=...)` takes them), so
nothing here names a hypothesis or a result."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.markdown import points
from mur.evals.report.traces import (
    Auroc,
    LiveArm,
    LiveRow,
    Question,
    RuleResult,
    first_ids,
    paired_difference,
)
from mur.nodes.voting import TraceRules


@dataclass(frozen=True)
class Decision:
    """One hypothesis (on one scope): its measured value and interval, and whether the
    registered test holds (None: pending, with the reason in `detail`; or, when `tested` is
    False, a figure reported beside the hypotheses and decided by none)."""

    name: str
    claim: str
    value: float
    interval: stats.Interval | None
    supported: bool | None
    detail: str = ""
    unit: Literal["points", "auroc"] = "points"
    tested: bool = True


def pending(name: str, claim: str, why: str) -> Decision:
    return Decision(name, claim, float("nan"), None, None, why)


def still_recording(recorded: int, planned: int | None) -> bool:
    """Whether a traces folder with `recorded` questions is short of the `planned` ones (None:
    whatever it holds is the plan)."""
    return planned is not None and recorded < planned


@dataclass(frozen=True)
class Evidence:
    """What an experiment's tests read: the records, and for a folder of traces the recorded
    questions (those with all their traces) and how many the folder has any trace of, the
    replayed rules by name, the AUROCs, and the live arms by name (on the complete questions)
    with their rows against majority@K."""

    records: Sequence[RunRecord]
    headline_gamma: float
    resamples: int
    seed: int
    questions: Sequence[Question] = ()
    recorded: int = 0
    k: int = 0
    rules: Mapping[str, RuleResult] = field(default_factory=dict)
    aurocs: Sequence[Auroc] = ()
    arms: Mapping[str, LiveArm] = field(default_factory=dict)
    rows: Mapping[str, LiveRow] = field(default_factory=dict)
    planned: int | None = None
    """The questions the experiment decides on (None: whatever the folder holds)."""
    named: Mapping[str, Sequence[RunRecord]] = field(default_factory=dict)
    """Folders given by name (`--live NAME=DIR`) to an experiment that reads several folders:
    its arms, each folder's records."""

    def unfinished(self) -> str | None:
        """Why the recorded folder cannot decide yet (its run has not reached every planned
        question), or None."""
        if not still_recording(self.recorded, self.planned):
            return None
        return (
            f"pending: {self.recorded} of {self.planned} questions recorded "
            f"({len(self.questions)} with all {self.k} traces)"
        )

    def uncovered(self, arm: str) -> str | None:
        """Why live arm `arm` cannot decide yet (absent, or short of a complete recorded
        question), or None."""
        if arm not in self.arms:
            return f"not decided: no live folder {arm!r}"
        ran = self.arms[arm].per_question
        missing = [q.problem_id for q in self.questions if q.problem_id not in ran]
        if missing:
            return (
                f"pending: live folder {arm!r} has {len(self.questions) - len(missing)} of "
                f"{len(self.questions)} questions (missing {first_ids(missing)})"
            )
        return self.unfinished()

    def paired(self, a: RuleResult, b: RuleResult) -> tuple[float, stats.Interval | None]:
        """Rule `a` - rule `b` in accuracy over the questions, with its bootstrap interval."""
        return paired_difference(
            a.per_question,
            b.per_question,
            sorted(a.per_question),
            resamples=self.resamples,
            seed=self.seed,
        )


@dataclass(frozen=True)
class Rule:
    """A trace rule an experiment replays on recorded traces: its label in the tables and its
    settings (TraceRules' fields, which are Context's) over a plain vote of all K traces."""

    label: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def rules(self, k: int) -> TraceRules:
        return replace(TraceRules(traces=k), **self.settings)


MAJORITY = Rule("majority")
"""The reference every replayed rule is put against: a plain vote of all K traces."""


@dataclass(frozen=True)
class Experiment:
    """A pre-registered experiment: what it reads, the rules it replays, the questions it
    plans, and its tests."""

    name: str
    document: str
    reads: Literal["traces", "folders"]
    """A folder of one setting's traces, or several run folders combined (`mur report A B
    --out DIR`)."""
    decide: Callable[[Evidence], list[Decision]]
    rules: Mapping[str, Rule] = field(default_factory=dict)
    """The rules it replays beside `MAJORITY`, by name (a folder of traces)."""
    questions: int | None = None
    """The questions it decides on: a folder short of them leaves its hypotheses pending."""
    arms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The folders its hypotheses read by name (`--live NAME=DIR`), each with the settings it
    must have been run with (a value, or a tuple of the values allowed): live trace rules
    beside a folder of traces, or the arms of an experiment that reads several folders."""
    sections: Callable[[Evidence, Path], str] | None = None
    """What the report shows after the decisions (an experiment's own tables and figures,
    written into the report's folder, the second argument), if anything."""

    @property
    def description(self) -> str:
        return self.document

    def check_arm(self, arm: LiveArm) -> None:
        """A live folder given under one of this experiment's arm names must have been run with
        that arm's settings: two folders swapped would decide the wrong test."""
        if arm.per_question:
            self._check_settings(arm.name, arm.folder, arm.config)

    def check_folder(self, name: str, folder: str, records: Sequence[RunRecord]) -> None:
        """The same for a folder an experiment that reads several folders takes by name: each
        record's Context must hold the arm's settings."""
        if name not in self.arms:
            raise ValueError(
                f"--live {name}=...: {self.document} has no arm {name!r}; its arms: "
                f"{', '.join(self.arms)}"
            )
        for record in records:
            self._check_settings(name, folder, record["trace"]["config"])

    def _check_settings(self, name: str, folder: str, config: Mapping[str, Any]) -> None:
        for setting, wanted in self.arms.get(name, {}).items():
            allowed = wanted if isinstance(wanted, tuple) else (wanted,)
            if config.get(setting) not in allowed:
                raise ValueError(
                    f"the live folder {folder} ran {setting}={config.get(setting)!r}; "
                    f"{self.document}'s arm {name!r} runs {setting}="
                    f"{' or '.join(map(repr, allowed))}: check which folder goes with which "
                    "--live name"
                )


def _shown(value: float, unit: str) -> str:
    return f"{value:.3f}" if unit == "auroc" else points(value)


def decisions_json(experiment: Experiment | None, decisions: Sequence[Decision]) -> dict[str, Any]:
    """An experiment's decisions as report.json holds them."""
    return {
        "prereg": experiment.document if experiment else None,
        "hypotheses": [asdict(d) for d in decisions],
    }


def decisions_markdown(experiment: Experiment, decisions: Sequence[Decision]) -> str:
    """The one table of an experiment's decisions."""
    lines = [
        f"Hypotheses of `{experiment.document}`:",
        "",
        "| hypothesis | measured | 95% interval | supported | |",
        "|---|---|---|---|---|",
    ]
    for d in decisions:
        shown = not (d.tested and d.supported is None)
        value = _shown(d.value, d.unit) + (" points" if d.unit == "points" else "")
        span = "-"
        if shown and d.interval:
            span = f"[{_shown(d.interval.low, d.unit)}, {_shown(d.interval.high, d.unit)}]"
        supported = {True: "yes", False: "no", None: "pending" if d.tested else "-"}
        lines.append(
            f"| {d.name}: {d.claim} | {value if shown else '-'} | {span} | "
            f"{supported[d.supported]} | {d.detail} |"
        )
    return "\n".join(lines)
