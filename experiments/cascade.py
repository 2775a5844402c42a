"""MUR as a step router (results/prereg-cascade.md, C1-C4): Qwen2.5-Coder-0.5B writes each
step, the 1.5B rewrites the steps a gate flags (`--strategy escalate`). Seven folders of the
same questions, one trace each, named by arm:

    mur report --prereg cascade --out results/cascade \\
        --live small=results/cascade-small --live large=results/cascade-large \\
        --live always=results/cascade-always --live mur=results/cascade-mur \\
        --live random=results/cascade-random --live smart=results/cascade-smart \\
        --live first_token=results/cascade-first-token

- C1, the cascade pays: MUR - the 0.5B alone, lower bound > 0.
- C2, economy: MUR - the 1.5B alone, lower bound > `ECONOMY_MARGIN`, with MUR's 1.5B tokens
  at most `ECONOMY_RATIO` of the 1.5B alone's (FLOP-weighted tokens beside).
- C3, MUR routes: MUR - random at MUR's realised rate, lower bound > 0.
- C4, the momentum matters: MUR - smart and MUR - first-token entropy, each at MUR's rate,
  both lower bounds > 0.

Each difference is paired by question (95% percentile bootstrap over the questions every arm
ran). Which model wrote a token follows from the arm: the backbone's are the 0.5B's but in the
`large` arm, where the 1.5B writes alone; the external tokens are the 1.5B's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from mur.evals.harness.run_record import RunRecord
from mur.evals.harness.wall_time import Timed, paired, read
from mur.evals.report import stats
from mur.evals.report.experiment import Decision, Evidence, Experiment, pending
from mur.evals.report.plots import accuracy_limits
from mur.evals.report.traces import first_ids, paired_difference
from mur.servers.processes.facts import describe_recorded

SMALL, LARGE = "small", "large"
ARMS: Mapping[str, Mapping[str, str]] = {
    SMALL: {"gate": "never"},
    LARGE: {"gate": "never"},
    "always": {"strategy": "escalate", "gate": "always"},
    "mur": {"strategy": "escalate", "gate": "mur"},
    "random": {"strategy": "escalate", "gate": "random"},
    "smart": {"strategy": "escalate", "gate": "smart"},
    "first_token": {"strategy": "escalate", "gate": "first_token"},
}
"""Each arm's folder, by name, and the settings its records must carry."""
PILOT_CHOICES: Mapping[str, float | str] = {
    "gamma": 0.9,
    "escalate_momentum": "draft",
    "tau": 0.8510,
    "first_token_threshold": 1.2713,
}
"""What the pilot chose (results/prereg-cascade.md), as the main run's commands give it: MUR's
gamma and reading of the momentum, smart's tau and first_token's threshold."""
WRITER = "writer"
"""A timed arm's key that is no graph setting: "verifier" when the external model's server
writes every step alone (the `large` arm)."""
TIMED_PREFIX = "cascade-"
"""The arms' names among `mur bench trace_time`'s arms: the prefix and the arm's."""
TIMED_ARMS: Mapping[str, Mapping[str, float | str]] = {
    name: {"strategy": "escalate", **settings, **PILOT_CHOICES}
    | ({WRITER: "verifier"} if name == LARGE else {})
    for name, settings in ARMS.items()
}
"""Each arm's settings for the wall time of one question alone (`mur bench trace_time --arms
cascade-NAME`), as the main run's commands give them (a gate reads only its own threshold);
the random arm takes MUR's realised rate from `--random-rate`."""
PARAMETERS = {SMALL: 0.494e9, LARGE: 1.544e9}
"""Qwen2.5-Coder-0.5B and -1.5B's parameters: a generated token costs about 2 x these FLOPs."""
QUESTIONS = 400
ECONOMY_RATIO = 0.5
ECONOMY_MARGIN = -0.05


@dataclass(frozen=True)
class ArmQuestion:
    """One question of one arm: right or not, the tokens each model generated, its steps,
    those the gate scaled, and the tokens of the drafts it escalated (what a first-token probe
    would not have generated)."""

    correct: bool
    small_tokens: int
    large_tokens: int
    steps: int
    scaled: int
    escalated_draft_tokens: int

    @property
    def flops(self) -> float:
        return 2 * (PARAMETERS[SMALL] * self.small_tokens + PARAMETERS[LARGE] * self.large_tokens)


def arm_question(arm: str, record: RunRecord) -> ArmQuestion:
    usage = record["usage"]
    backbone, external = usage["backbone_tokens"], usage["external_tokens"]
    drafts = sum(
        (step.get("refine") or {}).get("draft", {}).get("num_tokens", 0)
        for step in record["trace"]["steps"]
        if step["scaled"]
    )
    return ArmQuestion(
        correct=record["correct"],
        small_tokens=0 if arm == LARGE else backbone,
        large_tokens=backbone + external if arm == LARGE else external,
        steps=record["steps_total"],
        scaled=record["steps_scaled"],
        escalated_draft_tokens=drafts,
    )


def arms_of(named: Mapping[str, Sequence[RunRecord]]) -> dict[str, dict[str, ArmQuestion]]:
    """Each named folder's first sample of each question, as ArmQuestions (the report has
    checked each folder against its arm's settings: `Experiment.check_folder`)."""
    return {
        arm: {r["problem_id"]: arm_question(arm, r) for r in records if r["sample"] == 0}
        for arm, records in named.items()
    }


@dataclass(frozen=True)
class Cost:
    """An arm's mean cost per question on the paired questions."""

    small_tokens: float
    large_tokens: float
    flops: float
    rate: float
    probe_tokens: float
    """Generated tokens had each escalated draft been a one-token probe (GlimpRouter's)."""


def cost(arm: Mapping[str, ArmQuestion], ids: Sequence[str]) -> Cost:
    picked = [arm[q] for q in ids]
    steps = sum(q.steps for q in picked)
    generated = sum(q.small_tokens + q.large_tokens for q in picked)
    saved = sum(max(q.escalated_draft_tokens - q.scaled, 0) for q in picked)
    return Cost(
        small_tokens=stats.mean([q.small_tokens for q in picked]),
        large_tokens=stats.mean([q.large_tokens for q in picked]),
        flops=stats.mean([q.flops for q in picked]),
        rate=sum(q.scaled for q in picked) / steps if steps else 0.0,
        probe_tokens=(generated - saved) / len(picked),
    )


CLAIMS = {
    "C1": "the cascade pays: MUR - 0.5B alone, lower bound > 0",
    "C2": f"economy: MUR - 1.5B alone, lower bound > {ECONOMY_MARGIN * 100:+.0f} points, at "
    f"<= {ECONOMY_RATIO:g}x the 1.5B's generated tokens",
    "C3": "MUR routes: MUR - random at MUR's rate, lower bound > 0",
    "C4 smart": "the momentum matters: MUR - smart (STEER's threshold) at MUR's rate",
    "C4 first_token": "the momentum matters: MUR - first-token entropy (GlimpRouter) at MUR's rate",
}
AGAINST = {"C1": SMALL, "C2": LARGE, "C3": "random", "C4 smart": "smart",
           "C4 first_token": "first_token"}  # fmt: skip


def common_questions(arms: Mapping[str, Mapping[str, ArmQuestion]]) -> list[str]:
    shared = set.intersection(*(set(a) for a in arms.values())) if arms else set()
    return sorted(shared)


def why_pending(arms: Mapping[str, Mapping[str, ArmQuestion]], other: str) -> str | None:
    """Why MUR against `other` cannot be decided yet, or None."""
    if missing := [name for name in ("mur", other) if name not in arms]:
        return f"pending: no folder given as --live {missing[0]}=DIR"
    short = [f"{name} has {len(arms[name])}" for name in ("mur", other)
             if len(arms[name]) < QUESTIONS]  # fmt: skip
    return f"pending: arm {' and '.join(short)} of {QUESTIONS} questions" if short else None


def decide(e: Evidence) -> list[Decision]:
    """C1-C4, each on the questions all given arms share, with every arm's cost beside."""
    arms = arms_of(e.named)
    ids = common_questions(arms)
    decisions = []
    for name, other in AGAINST.items():
        if (why := why_pending(arms, other)) is not None:
            decisions.append(pending(name, CLAIMS[name], why))
            continue
        value, interval = paired_difference(
            arms["mur"], arms[other], ids, resamples=e.resamples, seed=e.seed
        )
        supported = interval is not None and interval.low > (
            ECONOMY_MARGIN if name == "C2" else 0.0
        )
        mur_cost, other_cost = cost(arms["mur"], ids), cost(arms[other], ids)
        detail = f"{len(ids)} questions; rates {mur_cost.rate:.3f} / {other_cost.rate:.3f}"
        if name == "C2":
            ratio = mur_cost.large_tokens / other_cost.large_tokens
            flops = mur_cost.flops / other_cost.flops
            supported = supported and ratio <= ECONOMY_RATIO
            detail = f"{len(ids)} questions; 1.5B tokens {ratio:.2f}x, FLOPs {flops:.2f}x"
        decisions.append(Decision(name, CLAIMS[name], value, interval, supported, detail))
    return decisions


def cost_section(e: Evidence, folder: Path) -> str:
    """Every arm's accuracy and cost per question on the questions all arms share, as a
    table and as the accuracy-cost plot (1.5B tokens, and FLOP-weighted tokens); then the wall
    time of one question alone per arm, when the report's folder holds it."""
    arms = arms_of(e.named)
    ids = common_questions(arms)
    if not ids:
        return "\n".join(
            [
                "No question is shared by every arm yet.",
                "",
                *wall_time_lines(folder / WALL_TIME_FILE),
            ]
        )
    points = {name: (accuracy(arm, ids), cost(arm, ids)) for name, arm in arms.items()}
    plot = plot_costs(points, folder / PLOT_NAME)
    lines = [
        f"Every arm on the {len(ids)} questions all share (per question; the tables further "
        "down group runs by setting, where the 0.5B alone and the 1.5B alone are both "
        "`never`: read the arms here):",
        "",
        "| arm | accuracy | 0.5B tokens | 1.5B tokens | GFLOPs | escalated | tokens with a "
        "one-token probe |",
        "|---|---|---|---|---|---|---|",
    ]
    missing = [a for a in ARMS if a not in arms]
    for name, (right, c) in points.items():
        lines.append(
            f"| {name} | {right:.1%} | {c.small_tokens:.0f} | {c.large_tokens:.0f} | "
            f"{c.flops / 1e9:.0f} | {c.rate:.1%} | {c.probe_tokens:.0f} |"
        )
    if missing:
        lines += ["", f"Not given yet: {first_ids(missing)}."]
    lines += ["", f"![accuracy against the cost of each arm]({plot.name})", ""]
    return "\n".join(lines + wall_time_lines(folder / WALL_TIME_FILE))


WALL_TIME_FILE = "wall-time.json"
"""`mur bench trace_time --arms cascade-... --out` into the report's folder: the wall time of
one question alone per arm (BENCHMARKS.md gives the command)."""


def wall_time_lines(path: Path) -> list[str]:
    """The wait for one question alone per arm, on the questions every timed arm shares, with
    each arm's wall time against the large model's alone (a cascade waits for two servers)."""
    if not path.is_file():
        return [f"Wall time: not measured yet (`mur bench trace_time --out {path}`)."]
    try:
        document, timed = read(path)
    except ValueError as exc:
        return [f"Wall time: {exc}"]
    ours = [r for r in timed if r.arm.startswith(TIMED_PREFIX)]
    runs = paired(ours, list(dict.fromkeys(r.arm for r in ours)))
    by_arm: dict[str, list[Timed]] = {}  # empty when the arms share no question
    for run in runs:
        by_arm.setdefault(run.arm.removeprefix(TIMED_PREFIX), []).append(run)
    shared = {r.problem_id for r in runs}
    large = stats.mean([r.wall_s for r in by_arm[LARGE]]) if LARGE in by_arm else None
    servers = " and ".join(
        describe_recorded(document[role]) for role in ("server", "verifier") if role in document
    )
    lines = [
        f"Wall time of one question alone, each arm on the {len(shared)} questions every timed "
        f"arm shares ({servers}):",
        "",
        "| arm | wall s / question | median | tokens / question | wall vs large |",
        "|---|---|---|---|---|",
    ]
    for arm, arm_runs in by_arm.items():
        wall = [r.wall_s for r in arm_runs]
        ratio = f"{stats.mean(wall) / large:.2f}x" if large else "-"
        lines.append(f"| {arm} | {stats.mean(wall):.1f} | {statistics.median(wall):.1f} | "
                     f"{stats.mean([r.tokens for r in arm_runs]):,.0f} | {ratio} |")  # fmt: skip
    return lines


def accuracy(arm: Mapping[str, ArmQuestion], ids: Sequence[str]) -> float:
    return stats.mean([float(arm[q].correct) for q in ids])


PLOT_NAME = "cascade_cost.png"


def plot_costs(points: Mapping[str, tuple[float, Cost]], path: Path) -> Path:
    """Accuracy against the 1.5B's tokens and against GFLOPs per question, one point per arm."""
    figure = Figure(figsize=(10, 4.2))
    for axes, (label, value) in zip(
        figure.subplots(1, 2),
        (
            ("1.5B tokens per question", lambda c: c.large_tokens),
            ("GFLOPs per question (2 x parameters x tokens)", lambda c: c.flops / 1e9),
        ),
        strict=True,
    ):
        for name, (right, c) in points.items():
            axes.scatter(value(c), 100 * right, color="tab:red" if name == "mur" else "tab:blue")
            axes.annotate(name, (value(c), 100 * right), textcoords="offset points",
                          xytext=(4, 4))  # fmt: skip
        axes.set_xlabel(label)
        axes.set_ylabel("accuracy (%)")
        axes.set_ylim(*accuracy_limits([100 * r for r, _ in points.values()], [0.0]))
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


@dataclass(frozen=True)
class Thresholds:
    """The smart and first_token gates' thresholds that flag MUR's share of a pilot's drafts."""

    rate: float
    """MUR's scaled share of its kept steps."""
    tau: float
    """smart: a draft whose mean token probability is below it is flagged."""
    first_token_threshold: float
    """first_token: a draft whose first token's entropy is above it is flagged."""


def drafts_seen(records: Sequence[RunRecord]) -> list[tuple[float, float]]:
    """(mean token probability, first-token entropy) of every draft the gate saw: the kept
    step's own for an unscaled step, the refine record's draft for a scaled one (the run must
    have asked for top logprobs)."""
    seen = []
    for record in records:
        for step in record["trace"]["steps"]:
            draft = (step.get("refine") or {}).get("draft") if step["scaled"] else None
            confidence = draft["confidence"] if draft else step["confidence"]
            entropy = step.get("first_token_entropy")
            if entropy is None or confidence is None:
                raise ValueError(
                    f"question {record['problem_id']} step {step['index']} has no "
                    "first_token_entropy: run the pilot with --top-logprobs 20"
                )
            seen.append((confidence, entropy))
    return seen


def pilot_thresholds(records: Sequence[RunRecord]) -> Thresholds:
    """Thresholds at which smart and first_token flag the share of the pilot's drafts that
    MUR escalated (quantiles of the drafts it saw; the gates then run live, from step 1)."""
    steps = sum(r["steps_total"] for r in records)
    rate = sum(r["steps_scaled"] for r in records) / steps
    seen = drafts_seen(records)
    confidences = sorted(c for c, _ in seen)
    entropies = sorted(h for _, h in seen)
    return Thresholds(
        rate=rate,
        tau=stats.percentile(confidences, rate * 100),
        first_token_threshold=stats.percentile(entropies, (1 - rate) * 100),
    )


EXPERIMENT = Experiment(
    "cascade",
    "results/prereg-cascade.md",
    reads="folders",
    decide=decide,
    questions=QUESTIONS,
    arms={name: dict(settings) for name, settings in ARMS.items()},
    sections=cost_section,
)
