"""Named settings of `experiments.table1`, and the tokens the paper's tables lead one to expect.

    mur experiment table1 --preset paper-gpu --dry-run

A preset is one registry entry: the strategies, the benchmarks (each with its own gamma,
questions and samples), the backbone and verifier server profiles (servers/processes/profiles.py)
and the `mur` settings every command gets. `PRESETS` is the only list; `--preset`'s choices follow.

The paper's numbers come from the project's algorithm contract (the shared
docs/mur-algorithm.md, "Paper figures to compare against", from Table 1 of arXiv 2507.14958).
It gives backbone tokens per question averaged over the four benchmarks, for three of the four
strategies, and nothing on the external model's tokens: `run_tokens` says how each missing
number is estimated, and `BUDGET_ASSUMPTIONS` prints it beside the budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import fmean

from mur.graphs.state import Context
from mur.nodes.gate_labels import parse_gate_label
from mur.nodes.registry import Registry


@dataclass(frozen=True)
class DatasetRun:
    """One benchmark of a table: its first `limit` questions, MUR's gamma there, and how many
    times each question is sampled (the paper averages AIME over 16 samples)."""

    name: str
    limit: int
    gamma: float
    samples: int = 1


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    strategies: tuple[str, ...]
    datasets: tuple[DatasetRun, ...]
    profile: str  # the backbone's server profile
    verifier_profile: str  # the external model's
    thinking_budget: int
    thinking_style: str

    def mur_args(self) -> tuple[str, ...]:
        """The `mur` settings every command of the preset gets (before the user's after --)."""
        return ("--thinking-budget", str(self.thinking_budget),
                "--thinking-style", self.thinking_style)  # fmt: skip


PAPER_GPU = Preset(
    name="paper-gpu",
    description="the paper's Table 1 setting: Qwen3-1.7B with GenPRM-1.5B as external model on "
    "MATH-500, AIME24, AIME25 and GPQA-diamond (docs/qwen3.md)",
    # The paper's TTS methods (guided search = best_of_n, LLM as a critic, phi-Decoding =
    # foresight) and the thinking switch; critic first: the cheapest, so it reports first.
    strategies=("critic", "best_of_n", "foresight", "thinking"),
    # Whole benchmarks (500, 30, 30, 198 questions: evals/questions/data/README.md and the
    # shared data's README). Gamma by dataset and AIME's 16 samples are the contract's. It
    # states the gammas under the thinking switch and is silent on the other strategies: the
    # same gamma serves them all here (the paper tunes gamma by dataset, not by strategy).
    datasets=(
        DatasetRun("math500", 500, gamma=0.9),
        DatasetRun("aime24", 30, gamma=0.8, samples=16),
        DatasetRun("aime25", 30, gamma=0.8, samples=16),
        DatasetRun("gpqa_diamond", 198, gamma=0.7),
    ),
    profile="qwen3-1.7b",
    verifier_profile="genprm-1.5b",
    # The contract's cap on thinking (2048 tokens). Its prefix `<think>\nOkay, so I need to`
    # cannot open thinking in Qwen3 on vLLM: Qwen3's template closes an empty think block before
    # a continued assistant message (vLLM issue 28089, docs/qwen3.md), so thinking is opened by
    # Qwen3's own template (`qwen3`, what the qwen3-* profiles recommend). `-- --thinking-style
    # prefix` puts the paper's prefix back, for a server whose template leaves it alone.
    thinking_budget=2048,
    thinking_style="qwen3",
)

CASCADE_GPU = Preset(
    name="cascade",
    description="MUR as a step router on a GPU: Qwen3-1.7B writes each step, Qwen3-8B rewrites "
    "the steps the gate flags (strategy escalate, thinking off), on the paper's four "
    "benchmarks (servers/README.md: serving the pair)",
    strategies=("escalate",),
    datasets=PAPER_GPU.datasets,
    profile="qwen3-1.7b",
    verifier_profile="qwen3-8b-external",
    # Every step, drafted or rewritten, is written with thinking off; the thinking settings
    # are the paper's, unused by escalate.
    thinking_budget=PAPER_GPU.thinking_budget,
    thinking_style=PAPER_GPU.thinking_style,
)

PRESETS: Registry[Preset] = Registry("preset", PAPER_GPU, CASCADE_GPU)


# ----------------------------------------------------------------------------- the budget


@dataclass(frozen=True)
class PaperRow:
    per_step: int  # every step scaled (the always gate)
    mur: int


#: Backbone tokens per question, Qwen3-1.7B, averaged over MATH-500, AIME24, AIME25 and
#: GPQA-diamond: the contract's "Paper figures to compare against" (the paper's Table 1).
PAPER_VANILLA_TOKENS = 2662
PAPER_TOKENS: Mapping[str, PaperRow] = {
    "best_of_n": PaperRow(per_step=11086, mur=3304),  # guided search
    "critic": PaperRow(per_step=2128, mur=2625),  # LLM as a critic
    "foresight": PaperRow(per_step=13231, mur=8537),  # phi-Decoding
}
#: The same section: "Scaled steps with MUR: 0.4 to 1.3 of about 4.4 to 8 steps per question".
PAPER_STEPS = (4.4, 8.0)
PAPER_MUR_SCALED_STEPS = (0.4, 1.3)
STEPS = fmean(PAPER_STEPS)
MUR_SCALED_STEPS = fmean(PAPER_MUR_SCALED_STEPS)
_DEFAULTS = Context.model_fields
JUDGE_CAP = int(_DEFAULTS["judge_max_tokens"].default)
#: External judgements per scaled step at the defaults: the critic judges the step once a
#: round, best-of-N each candidate; the other strategies ask the external model nothing.
JUDGEMENTS = {
    "critic": int(_DEFAULTS["critic_rounds"].default),
    "best_of_n": int(_DEFAULTS["num_candidates"].default),
}

BUDGET_ASSUMPTIONS = (
    "the contract gives tokens per question averaged over the four benchmarks only, so every "
    "dataset's question is priced at that average (datasets differ by their runs, not their "
    "length)",
    "never = Vanilla CoT; always = the strategy's per-step row; every other gate (mur, mur+bc, "
    "average, smart, random, a sweep's gammas) = its MUR row",
    f"thinking has no paper figure: Vanilla CoT plus, per scaled step, the whole thinking cap "
    f"and the step written again (Vanilla / {STEPS:g} steps); scaled steps {STEPS:g} (always) "
    f"or {MUR_SCALED_STEPS:g} (other gates), the middles of the paper's {PAPER_STEPS[0]:g}-"
    f"{PAPER_STEPS[1]:g} steps and {PAPER_MUR_SCALED_STEPS[0]:g}-{PAPER_MUR_SCALED_STEPS[1]:g} "
    "scaled by MUR",
    f"escalate has no paper figure: Vanilla CoT's drafts, and per scaled step one step "
    f"(Vanilla / {STEPS:g} steps) written again by the external model",
    f"external (GenPRM) tokens have no paper figure: an upper bound, every judgement at its "
    f"{JUDGE_CAP}-token cap, {JUDGEMENTS['critic']} per scaled step for critic and "
    f"{JUDGEMENTS['best_of_n']} for best_of_n",
)


@dataclass(frozen=True)
class Tokens:
    """Expected tokens: the backbone's (from the paper) and the external model's (a bound)."""

    backbone: float = 0.0
    external: float = 0.0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.backbone + other.backbone, self.external + other.external)

    def times(self, runs: int) -> Tokens:
        return Tokens(self.backbone * runs, self.external * runs)


def run_tokens(strategy: str, label: str, thinking_budget: int) -> Tokens | None:
    """The expected tokens of one run (one question, one sample) of `strategy` under gate
    label `label`, by BUDGET_ASSUMPTIONS; None for a strategy the paper gives no basis for."""
    gate = parse_gate_label(label)[0]
    if gate == "never":
        return Tokens(PAPER_VANILLA_TOKENS)
    scaled = STEPS if gate == "always" else MUR_SCALED_STEPS
    external = scaled * JUDGEMENTS.get(strategy, 0) * JUDGE_CAP
    if strategy in PAPER_TOKENS:
        row = PAPER_TOKENS[strategy]
        return Tokens(row.per_step if gate == "always" else row.mur, external)
    if strategy == "thinking":
        per_scaled = thinking_budget + PAPER_VANILLA_TOKENS / STEPS
        return Tokens(PAPER_VANILLA_TOKENS + scaled * per_scaled, external)
    if strategy == "escalate":
        return Tokens(PAPER_VANILLA_TOKENS, scaled * PAPER_VANILLA_TOKENS / STEPS)
    return None


def budget_lines(by_dataset: Mapping[str, tuple[int, Tokens]], unpriced: set[str]) -> list[str]:
    """The budget as the dry run prints it: runs and tokens per dataset, the total, and the
    assumptions that made the numbers."""

    def row(name: str, runs: int, tokens: Tokens) -> str:
        return f"#   {name:<14}{runs:>8,}{tokens.backbone:>16,.0f}{tokens.external:>20,.0f}"

    lines = [
        "# Expected tokens, estimated from the paper's Table 1 (Qwen3-1.7B; assumptions below):",
        f"#   {'dataset':<14}{'runs':>8}{'backbone':>16}{'external (bound)':>20}",
    ]
    total_runs, total = 0, Tokens()
    for name, (runs, tokens) in by_dataset.items():
        lines.append(row(name, runs, tokens))
        total_runs, total = total_runs + runs, total + tokens
    lines.append(row("total", total_runs, total))
    lines += [f"# - {assumption}" for assumption in BUDGET_ASSUMPTIONS]
    if unpriced:
        lines.append(f"# - not in the budget (no paper figure): {', '.join(sorted(unpriced))}")
    return lines
