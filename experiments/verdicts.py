"""How well a forced verdict stands in for one the critic never wrote, on recorded judgements.

    mur experiment verdicts results/math500-critic-qwen2.5-coder-1.5b \\
        --base-url http://127.0.0.1:8022/v1 --out results/forced-verdicts.md

A table's critic records keep every judgement: its prompt parts (question, kept steps, the
step judged) and its text. Two replays against the same server, with `continue_to_verdict`
(the code `judge_step` runs):

- cut: judgements that reached their token cap without a verdict (what the critic revised on
  no evidence). Which verdict does the continued line give them, and how confidently?
- agreement: judgements that did give a boxed verdict, cut at a share of their analysis
  (`--at`, default 0 and 0.5: no analysis at all, half of it) and continued. How often does
  the forced verdict match the one the critic wrote after its whole analysis?

Only the few verdict tokens are generated (the analysis is the prompt, mostly prefix-cached),
so a few hundred judgements take minutes even on a CPU server.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage

from mur.evals.harness.run_record import RunRecord
from mur.nodes.judge import VERDICT_PATTERN, continue_to_verdict, forced_verdict, judge_prompt


@dataclass(frozen=True)
class RecordedJudgement:
    """One critic round of a record: the judge prompt's parts and what the critic wrote."""

    question: str
    kept_texts: tuple[str, ...]
    index: int
    paragraph: str
    text: str
    verdict: bool | None
    num_tokens: int


@dataclass(frozen=True)
class Replayed:
    kind: str  # "cut" or "agreement"
    recorded: bool | None
    forced: bool | None
    p_yes: float
    tokens: int


def recorded_judgements(
    records: Sequence[RunRecord], questions: dict[str, str]
) -> Iterator[RecordedJudgement]:
    """Every critic round in the records' traces, in record order."""
    for record in records:
        steps = record["trace"]["steps"]
        for step in steps:
            refine = step.get("refine") or {}
            if refine.get("strategy") != "critic":
                continue
            kept = tuple(s["text"] for s in steps[: step["index"] - 1])
            for round_ in refine["rounds"]:
                yield RecordedJudgement(
                    question=questions[record["problem_id"]],
                    kept_texts=kept,
                    index=step["index"],
                    paragraph=round_["step"],
                    text=round_["critique"],
                    verdict=round_["verdict"],
                    num_tokens=round_["num_tokens"],
                )


def analysis_share(text: str, share: float) -> str | None:
    """The first `share` of the analysis before a judgement's last boxed verdict, cut at a
    space (share 0: nothing); None when the judgement has no boxed verdict."""
    found = list(VERDICT_PATTERN.finditer(text))
    if not found:
        return None
    analysis = text[: found[-1].start()]
    cut = analysis.rfind(" ", 0, int(len(analysis) * share))
    return analysis[: max(cut, 0)]


Job = tuple[str, RecordedJudgement, str]  # kind ("cut" or "agreement@share"), judgement, text


def plan(
    judgements: Sequence[RecordedJudgement], cap: int, limit: int, shares: Sequence[float]
) -> list[Job]:
    """The first `limit` cut judgements, then the first `limit` boxed ones at each share."""
    cut = [j for j in judgements if j.verdict is None and j.num_tokens >= cap]
    boxed = [j for j in judgements if j.verdict is not None and VERDICT_PATTERN.search(j.text)]
    jobs: list[Job] = [("cut", j, j.text) for j in cut[:limit]]
    for share in shares:
        jobs += [
            (f"agreement@{share:g}", j, analysis_share(j.text, share) or "") for j in boxed[:limit]
        ]
    return jobs


async def replay(verifier: BaseChatModel, jobs: Sequence[Job], concurrency: int) -> list[Replayed]:
    gate = asyncio.Semaphore(concurrency)

    async def one(kind: str, judgement: RecordedJudgement, text: str) -> Replayed:
        prompt = HumanMessage(
            judge_prompt(
                judgement.question, judgement.kept_texts, judgement.index, judgement.paragraph
            )
        )
        async with gate:
            reply = await continue_to_verdict(verifier, prompt, text)
        choice = reply.choices[0]
        verdict, probability = forced_verdict(choice)
        return Replayed(
            kind=kind,
            recorded=judgement.verdict,
            forced=verdict,
            p_yes=probability,
            tokens=choice.num_tokens,
        )

    return list(await asyncio.gather(*(one(*job) for job in jobs)))


def _share(count: int, total: int) -> str:
    return f"{count} ({100 * count / total:.0f}%)" if total else "0"


def report(results: Sequence[Replayed], source: str, cap: int, model: str) -> str:
    """A markdown summary of both replays."""
    lines = [f"# Forced verdicts of {model}, replayed on {source}", ""]
    cut = [r for r in results if r.kind == "cut"]
    if cut:
        said = Counter(r.forced for r in cut)
        mean_p = sum(r.p_yes for r in cut) / len(cut)
        lines += [
            f"## Judgements cut at the {cap}-token cap without a verdict ({len(cut)})",
            "",
            "| forced verdict | judgements |",
            "|---|---|",
            f"| Yes (kept, no revision) | {_share(said[True], len(cut))} |",
            f"| No (revised) | {_share(said[False], len(cut))} |",
            f"| still none | {_share(said[None], len(cut))} |",
            "",
            f"Mean P(Yes) of the forced verdict token: {mean_p:.2f}.",
            "",
        ]
    shares = sorted({r.kind for r in results if r.kind.startswith("agreement@")})
    if shares:
        lines += [
            "## Boxed verdicts, forced again from a share of their analysis",
            "",
            "| analysis kept | judgements | agreement | Yes kept Yes | No kept No | forced none |",
            "|---|---|---|---|---|---|",
        ]
        for kind in shares:
            rows = [r for r in results if r.kind == kind]
            pairs = Counter((r.recorded, r.forced) for r in rows)
            said_yes = sum(n for (recorded, _), n in pairs.items() if recorded)
            said_no = len(rows) - said_yes
            lines.append(
                f"| {100 * float(kind.partition('@')[2]):.0f}% | {len(rows)} | "
                f"{_share(pairs[(True, True)] + pairs[(False, False)], len(rows))} | "
                f"{_share(pairs[(True, True)], said_yes)} | "
                f"{_share(pairs[(False, False)], said_no)} | "
                f"{sum(n for (_, forced), n in pairs.items() if forced is None)} |"
            )
        lines.append("")
    tokens = sum(r.tokens for r in results) / max(len(results), 1)
    lines += [f"Generated tokens per forced verdict: {tokens:.1f}.", ""]
    return "\n".join(lines)
