"""The run record: one line of records.jsonl, the contract between the runner that writes it
and every reader (reports, comparisons, experiments, benchmarks).

A `TypedDict`, not a class: a record is the JSON object on disk, read back as it is, so files
written by earlier versions (without `finished_at`, say) load unchanged and byte for byte, and
a type checker still knows every field a reader takes. `make_record` is the one writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, cast

from mur.graphs.state import Fallback, FinishReason, StepRecord, TraceSummary


class RecordedUsage(TypedDict):
    """Completion and prompt tokens of one question (nodes.llm.USAGE_KEYS)."""

    backbone_tokens: int
    external_tokens: int
    backbone_prompt_tokens: int
    external_prompt_tokens: int
    llm_calls: int
    failed_calls: NotRequired[int]  # records written before it was counted lack it


class Trace(TypedDict):
    """The graph's output contract without the question (questions stay in the datasets)."""

    answer: str | None
    finish_reason: FinishReason | None
    steps: list[StepRecord]
    usage: RecordedUsage
    fallback: Fallback | None
    config: dict[str, Any]
    traces: NotRequired[list[TraceSummary]]  # records written before traces existed lack it


class RunRecord(TypedDict):
    """One finished run of one question: its setting, its grade, its cost and its trace."""

    key: str  # JobKey.text: what a rerun skips
    dataset: str
    problem_id: str
    strategy: str
    gate: str  # the gate label (mur, mur+bc, random@0.12, mur[budget=800])
    gamma: float | None  # None: a gate that does not read gamma
    sample: int
    gold: str
    answer: str | None
    correct: bool
    usage: RecordedUsage
    steps_total: int
    steps_scaled: int
    finish_reason: FinishReason | None
    latency_s: float
    finished_at: NotRequired[str]  # UTC, ISO 8601; records written before it lack it
    resumed: NotRequired[bool]  # only for a question that went on from its checkpoint: true
    trace: Trace


@dataclass(frozen=True)
class JobKey:
    """What identifies one run of one question."""

    dataset: str
    problem_id: str
    strategy: str
    gate: str
    gamma: float | None  # None: a gate that does not read gamma
    sample: int

    @property
    def text(self) -> str:
        return f"{self.dataset}/{self.problem_id}/{self.setting}/{self.sample}"

    @property
    def setting(self) -> str:
        """What a run is besides its question and sample: strategy, gate label and gamma."""
        return setting_of(self.strategy, self.gate, self.gamma)


def setting_of(strategy: str, gate: str, gamma: float | None) -> str:
    """`critic/mur/0.9`; `critic/never/-` for a gate that does not read gamma. A record's is
    `setting_of(record["strategy"], record["gate"], record["gamma"])`."""
    return f"{strategy}/{gate}/{'-' if gamma is None else f'{gamma:g}'}"


def total_tokens(record: RunRecord) -> int:
    """Backbone plus external completion tokens: what a question cost."""
    return record["usage"]["backbone_tokens"] + record["usage"]["external_tokens"]


def make_record(
    key: JobKey,
    gold: str,
    result: Mapping[str, Any],
    correct: bool,
    latency_s: float,
    finished_at: datetime | None = None,
    resumed: bool = False,
) -> RunRecord:
    """One line of records.jsonl from the graph's output. `finished_at` (UTC, now by default)
    with `latency_s` dates the run, so a report can tell how long a table resumed across
    sessions took; `resumed` (recorded only when true) marks a question that went on from its
    checkpoint. The key order is the file's: keep it."""
    steps = result["steps"]
    finished_at = finished_at or datetime.now(UTC)
    trace = cast(Trace, {k: v for k, v in result.items() if k != "question"})
    record = {
        "key": key.text,
        "dataset": key.dataset,
        "problem_id": key.problem_id,
        "strategy": key.strategy,
        "gate": key.gate,
        "gamma": key.gamma,
        "sample": key.sample,
        "gold": gold,
        "answer": result["answer"],
        "correct": correct,
        "usage": result["usage"],
        "steps_total": len(steps),
        "steps_scaled": sum(1 for s in steps if s["scaled"]),
        "finish_reason": result["finish_reason"],
        "latency_s": round(latency_s, 3),
        "finished_at": finished_at.isoformat(timespec="milliseconds"),
        **({"resumed": True} if resumed else {}),
        "trace": trace,
    }
    return cast(RunRecord, record)
