"""MUR's gate inside a LangChain agent on BFCL's multi-turn cases (results/prereg-bfcl.md,
B1-B2): Qwen2.5-Coder-0.5B is the agent's model, the 1.5B rewrites the calls a gate flags
(`mur experiment bfcl`). Four folders of the same cases, one run each, named by arm:

    mur report --prereg bfcl --out results/bfcl \\
        --live small=results/bfcl-small --live always=results/bfcl-always \\
        --live mur=results/bfcl-mur --live random=results/bfcl-random

- B1, the gate pays: mur - small, lower bound > 0.
- B2, MUR picks: mur - random at MUR's realised rate, lower bound > 0.

Each difference is paired by case (95% percentile bootstrap over the cases every arm ran).
`pilot_choices` applies the pilot's rules (the categories where the 1.5B beats the 0.5B by 10
points, the gamma whose replayed rate is nearest 30%).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.experiment import Decision, Evidence, Experiment, pending
from mur.evals.report.traces import first_ids, paired_difference
from mur.nodes.gates import replay_decisions

ARMS: Mapping[str, Mapping[str, str]] = {
    "small": {"gate": "never"},
    "always": {"gate": "always"},
    "mur": {"gate": "mur"},
    "random": {"gate": "random"},
}
"""Each arm's folder, by name, and the gate its records must carry."""
CASES_PER_CATEGORY = 100
CLAIMS = {
    "B1": "the gate pays: mur - the 0.5B alone, lower bound > 0",
    "B2": "MUR picks: mur - random at MUR's rate, lower bound > 0",
}
AGAINST = {"B1": "small", "B2": "random"}
GAP = 0.10
"""The pilot's minimum accuracy gap (1.5B - 0.5B) for a category to enter the main run."""
GAMMAS = (0.9, 0.95, 0.98, 0.99, 0.995)
TARGET_RATE = 0.30


@dataclass(frozen=True)
class ArmCase:
    """One case of one arm: valid or not, the tokens each model generated, the model calls
    the gate saw and those it escalated."""

    correct: bool
    small_tokens: int
    large_tokens: int
    calls: int
    escalated: int


def arm_case(record: RunRecord) -> ArmCase:
    usage = record["usage"]
    return ArmCase(
        correct=record["correct"],
        small_tokens=usage["backbone_tokens"],
        large_tokens=usage["external_tokens"],
        calls=record["steps_total"],
        escalated=record["steps_scaled"],
    )


def arms_of(named: Mapping[str, Sequence[RunRecord]]) -> dict[str, dict[str, ArmCase]]:
    return {arm: {r["problem_id"]: arm_case(r) for r in records} for arm, records in named.items()}


def shared_cases(arms: Mapping[str, Mapping[str, ArmCase]]) -> list[str]:
    return sorted(set.intersection(*(set(arm) for arm in arms.values()))) if arms else []


def expected_cases(named: Mapping[str, Sequence[RunRecord]]) -> int:
    """CASES_PER_CATEGORY for each category the folders hold (the pilot chose them)."""
    categories = {r["problem_id"].rsplit("_", 1)[0] for rs in named.values() for r in rs}
    return CASES_PER_CATEGORY * max(len(categories), 1)


def decide(e: Evidence) -> list[Decision]:
    """B1 and B2 on the cases all given arms share."""
    arms = arms_of(e.named)
    ids = shared_cases(arms)
    wanted = expected_cases(e.named)
    decisions = []
    for name, other in AGAINST.items():
        if missing := [arm for arm in ("mur", other) if arm not in arms]:
            decisions.append(pending(name, CLAIMS[name], f"pending: no --live {missing[0]}=DIR"))
            continue
        if short := [f"{arm} has {len(arms[arm])}" for arm in ("mur", other)
                     if len(arms[arm]) < wanted]:  # fmt: skip
            why = f"pending: arm {' and '.join(short)} of {wanted} cases"
            decisions.append(pending(name, CLAIMS[name], why))
            continue
        value, interval = paired_difference(
            arms["mur"], arms[other], ids, resamples=e.resamples, seed=e.seed
        )
        rates = f"{escalated_share(arms['mur'], ids):.3f} / {escalated_share(arms[other], ids):.3f}"
        supported = interval is not None and interval.low > 0
        detail = f"{len(ids)} cases; escalated calls {rates}"
        decisions.append(Decision(name, CLAIMS[name], value, interval, supported, detail))
    return decisions


def escalated_share(arm: Mapping[str, ArmCase], ids: Sequence[str]) -> float:
    calls = sum(arm[i].calls for i in ids)
    return sum(arm[i].escalated for i in ids) / calls if calls else 0.0


def cost_section(e: Evidence, folder: Path) -> str:
    """Every arm's accuracy and cost per case on the cases all arms share."""
    arms = arms_of(e.named)
    ids = shared_cases(arms)
    if not ids:
        return "No case is shared by every arm yet."
    lines = [
        f"Every arm on the {len(ids)} cases all share (per case):",
        "",
        "| arm | valid | 0.5B tokens | 1.5B tokens | model calls | escalated |",
        "|---|---|---|---|---|---|",
    ]
    for name, arm in arms.items():
        picked = [arm[i] for i in ids]
        lines.append(
            f"| {name} | {stats.mean([float(c.correct) for c in picked]):.1%} | "
            f"{stats.mean([c.small_tokens for c in picked]):.0f} | "
            f"{stats.mean([c.large_tokens for c in picked]):.0f} | "
            f"{stats.mean([c.calls for c in picked]):.1f} | {escalated_share(arm, ids):.1%} |"
        )
    if missing := [a for a in ARMS if a not in arms]:
        lines += ["", f"Not given yet: {first_ids(missing)}."]
    return "\n".join(lines)


@dataclass(frozen=True)
class PilotChoices:
    """What the pilot's rules choose: each category's accuracy gap, those that enter the main
    run, each gamma's replayed rate and the gamma chosen (None without a category)."""

    gaps: dict[str, float]
    categories: list[str]
    rates: dict[float, float]
    gamma: float | None


def replayed_rate(records: Sequence[RunRecord], gamma: float, alpha: float = 0.9) -> float:
    """The share of calls MUR at `gamma` would flag, replayed over each case's recorded call
    uncertainties (the momentum over the case, call 1 never flagged)."""
    flagged = calls = 0
    for record in records:
        uncertainties = [step["uncertainty"] for step in record["trace"]["steps"]]
        flagged += sum(replay_decisions("mur", uncertainties, alpha=alpha, gamma=gamma))
        calls += len(uncertainties)
    return flagged / calls if calls else 0.0


def pilot_choices(
    small: Mapping[str, Sequence[RunRecord]], large: Mapping[str, Sequence[RunRecord]]
) -> PilotChoices:
    """The pre-registered rules over the pilot's folders, by category: those where the 1.5B
    alone beats the 0.5B alone by GAP or more; the gamma of GAMMAS whose replayed rate on the
    0.5B's calls in them is nearest TARGET_RATE (a tie to the smaller gamma)."""
    gaps = {c: _accuracy(large[c]) - _accuracy(records) for c, records in small.items()}
    chosen = [c for c, gap in gaps.items() if gap >= GAP - 1e-9]
    pooled = [r for c in chosen for r in small[c]]
    rates = {gamma: replayed_rate(pooled, gamma) for gamma in GAMMAS} if chosen else {}
    gamma = min(rates, key=lambda g: (abs(rates[g] - TARGET_RATE), g)) if rates else None
    return PilotChoices(gaps, chosen, rates, gamma)


def _accuracy(records: Sequence[RunRecord]) -> float:
    return stats.mean([float(r["correct"]) for r in records])


EXPERIMENT = Experiment(
    "bfcl",
    "results/prereg-bfcl.md",
    reads="folders",
    decide=decide,
    arms={name: dict(settings) for name, settings in ARMS.items()},
    sections=cost_section,
)
