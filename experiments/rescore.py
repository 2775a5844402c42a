"""Does this server see the uncertainties a table was recorded with? Re-score recorded steps.

    mur experiment rescore results/math500-best_of_n-qwen2.5-coder-1.5b \\
        --base-url http://127.0.0.1:8022/v1 [--gate never] [--limit 20] [--out FILE]

A trace keeps every kept step's text and its uncertainty m_t, the mean -logprob of the tokens
the model generated for it. This sends the trace back as the prompt (the conversation, then the
steps with their separators) and asks the server for the logprobs of those prompt tokens:
nothing is generated, so the same tokens are scored in the same context, one request a trace.
It reports how far the two m_t lie apart, against how much m_t varies from step to step, and
how many of MUR's decisions, replayed on each trace, come out differently.

Run it before a table recorded on one machine is continued on another (another CPU, dtype,
GPU or vLLM version): if the gate decides the same steps, the two halves measure one
experiment. Only steps followed by another step are compared (they ended at the separator the
prompt appends; the last one ended at the end of the sequence), and only where the step's
tokens come out as many as were generated (a different tokenization scores other tokens). On
Qwen2.5 with paragraph steps 238 of 239 steps line up. Steps after a `StepN:` marker do not:
the trace keeps the text stripped of the space the model wrote after the marker. On SmolLM2
only a paragraph trace's first step can: its tokenizer writes a blank line that ends the text
as one token (1116), the one the model saw at the end of its prompt, and a blank line that
more text follows as two (198, 198), so the steps joined by blank lines tokenize otherwise.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from langchain_core.messages import BaseMessage

from mur.evals.harness.run_record import RunRecord
from mur.evals.questions import Problem
from mur.nodes.draft import STEP_FORMATS, step_messages
from mur.nodes.gates import replay_decisions
from mur.nodes.llm import CONTINUE_FINAL_MESSAGE
from mur.servers.clients.errors import ServerError
from mur.servers.clients.probes import normalize_base_url

_ROLES = {"system": "system", "human": "user", "ai": "assistant"}


@dataclass(frozen=True)
class RecordedStep:
    """A kept step of a trace: its prompt up to the step, its text and what was recorded."""

    index: int
    prefix: tuple[dict[str, str], ...]
    text: str
    separator: str  # the stop that ended it, generated with it ("" if the token cap did)
    uncertainty: float
    num_tokens: int


@dataclass(frozen=True)
class Trace:
    key: str
    uncertainties: tuple[float, ...]
    steps: tuple[RecordedStep, ...]  # the comparable ones: all but the last


def _as_openai(messages: Sequence[BaseMessage]) -> tuple[dict[str, str], ...]:
    return tuple({"role": _ROLES[m.type], "content": str(m.content)} for m in messages)


def recorded_traces(
    records: Sequence[RunRecord],
    problems: dict[tuple[str, str], Problem],
    settings: dict[str, Any],
    gate: str,
    limit: int,
) -> Iterator[Trace]:
    """The first `limit` traces of `gate` in which no step was scaled (a scaled step's kept
    text is not the draft whose uncertainty the gate saw)."""
    fmt = STEP_FORMATS[settings.get("step_format", "marker")]
    cap = settings.get("max_step_tokens", float("inf"))  # a step cut there has no separator
    taken = 0
    for record in records:
        steps = record["trace"]["steps"]
        if record["gate"] != gate or any(s["scaled"] for s in steps) or taken >= limit:
            continue
        problem = problems.get((record["dataset"], record["problem_id"]))
        if problem is None:
            raise ValueError(
                f"{record['dataset']} question {record['problem_id']} of {record['key']} is not "
                "in the data read: pass the --data-dir the runs used"
            )
        texts = [s["text"] for s in steps]
        comparable = tuple(
            RecordedStep(
                index=s["index"],
                prefix=_as_openai(
                    step_messages(
                        problem.question, problem.system_prompt, texts[:k], s["index"], fmt
                    )
                ),
                text=s["text"],
                separator="" if s["num_tokens"] >= cap else fmt.stops(s["index"])[0],
                uncertainty=s["uncertainty"],
                num_tokens=s["num_tokens"],
            )
            for k, s in enumerate(steps[:-1])
        )
        if comparable:
            taken += 1
            yield Trace(record["key"], tuple(s["uncertainty"] for s in steps), comparable)


class Scorer:
    """Scores a step's tokens as prompt tokens on a vLLM server (`prompt_logprobs`)."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str) -> None:
        self.client, self.model = client, model
        self.v1 = normalize_base_url(base_url)
        self.root = self.v1.removesuffix("/v1")

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post(url, json=body)
        if response.status_code != 200:
            raise ServerError(f"{url} answered HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    def _body(self, prefix: Sequence[dict[str, str]], assistant: str) -> dict[str, Any]:
        messages = [*prefix[:-1], {"role": "assistant", "content": assistant}]
        return {"model": self.model, "messages": messages, **CONTINUE_FINAL_MESSAGE}

    async def _tokens(self, prefix: Sequence[dict[str, str]], assistant: str) -> list[int]:
        return (await self._post(f"{self.root}/tokenize", self._body(prefix, assistant)))["tokens"]

    async def uncertainties(self, trace: Trace) -> list[float | None]:
        """m_t of each comparable step of the trace on this server, from one request: vLLM
        computes a prompt token's logprob over the whole vocabulary, so a request per step would
        score the early steps again and again. None where a step's tokens do not line up with
        those generated (another count, or tokenized differently at the step's edges)."""
        if not trace.steps:
            return []
        known: dict[str, list[int]] = {}  # a step's "through" is the next one's "before"

        async def tokens(assistant: str) -> list[int]:
            if assistant not in known:
                known[assistant] = await self._tokens(trace.steps[0].prefix, assistant)
            return known[assistant]

        last = trace.steps[-1]
        whole = last.prefix[-1]["content"] + last.text + last.separator
        ids = await tokens(whole)
        scored = await self._post(
            f"{self.v1}/chat/completions",
            {
                **self._body(last.prefix, whole),
                "max_tokens": 1,
                "temperature": 0,
                "prompt_logprobs": 0,
            },
        )
        entries = scored["prompt_logprobs"]
        found: list[float | None] = []
        for step in trace.steps:
            start = step.prefix[-1]["content"]
            before = await tokens(start)
            through = await tokens(start + step.text + step.separator)
            cut, end = len(before), len(through)
            if through[:cut] != before or ids[:end] != through or end - cut != step.num_tokens:
                found.append(None)
                continue
            logprobs = [entries[i][str(ids[i])]["logprob"] for i in range(cut, end)]
            found.append(-float(np.mean(logprobs)))
        return found


async def rescore(
    scorer: Scorer, traces: Sequence[Trace], concurrency: int
) -> list[list[float | None]]:
    """Per trace, the server's m_t of each comparable step (None where not aligned)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(trace: Trace) -> list[float | None]:
        async with gate:
            return await scorer.uncertainties(trace)

    return list(await asyncio.gather(*(one(t) for t in traces)))


@dataclass(frozen=True)
class Agreement:
    steps: int
    aligned: int
    recorded_mean: float
    rescored_mean: float
    mean_abs_diff: float
    max_abs_diff: float
    between_steps_sd: float
    correlation: float
    # per MUR setting: (decisions that differ, decisions, scaled share recorded, rescored)
    flips: dict[str, tuple[int, int, float, float]]


def agreement(
    traces: Sequence[Trace],
    rescored: Sequence[Sequence[float | None]],
    alpha: float,
    gates: Sequence[tuple[str, float, bool]],
) -> Agreement:
    """Differences on aligned steps, and MUR's decisions on the recorded uncertainties
    against the same traces with each aligned step's m_t replaced by the server's."""
    pairs = [
        (step.uncertainty, new)
        for trace, news in zip(traces, rescored, strict=True)
        for step, new in zip(trace.steps, news, strict=True)
        if new is not None
    ]
    if not pairs:
        raise ValueError(
            f"none of the {sum(len(t.steps) for t in traces)} steps tokenized as generated, so "
            "there is nothing to compare (traces keep each step's text stripped, so steps "
            "written after a StepN: marker never do: rescore paragraph-format runs)"
        )
    old, new = (np.array(side, dtype=float) for side in zip(*pairs, strict=True))
    flips: dict[str, tuple[int, int, float, float]] = {}
    for label, gamma, bias_correction in gates:
        decide = functools.partial(
            replay_decisions, "mur", alpha=alpha, gamma=gamma, bias_correction=bias_correction
        )
        differ = decided = before = after = 0
        for trace, news in zip(traces, rescored, strict=True):
            replaced = list(trace.uncertainties)
            for step, value in zip(trace.steps, news, strict=True):
                if value is not None:
                    replaced[step.index - 1] = value
            a, b = decide(trace.uncertainties)[1:], decide(replaced)[1:]
            differ += sum(x != y for x, y in zip(a, b, strict=True))
            decided, before, after = decided + len(a), before + sum(a), after + sum(b)
        flips[label] = (differ, decided, before / max(decided, 1), after / max(decided, 1))
    return Agreement(
        steps=sum(len(t.steps) for t in traces),
        aligned=len(pairs),
        recorded_mean=float(old.mean()),
        rescored_mean=float(new.mean()),
        mean_abs_diff=float(np.abs(new - old).mean()),
        max_abs_diff=float(np.abs(new - old).max()),
        between_steps_sd=float(old.std()),
        correlation=float(np.corrcoef(old, new)[0, 1]) if len(old) > 1 else float("nan"),
        flips=flips,
    )


def report(result: Agreement, folder: str, base_url: str, model: str, traces: int) -> str:
    share = 100 * result.aligned / max(result.steps, 1)
    lines = [
        f"# Recorded step uncertainties re-scored on {base_url} ({model})",
        "",
        f"From `{folder}`: {traces} traces, {result.steps} steps followed by another; "
        f"{result.aligned} ({share:.0f}%) tokenized as generated and compared.",
        "",
        "| m_t, recorded | m_t, this server | mean abs difference | max abs difference "
        "| sd of m_t between steps | correlation |",
        "|---|---|---|---|---|---|",
        f"| {result.recorded_mean:.4f} | {result.rescored_mean:.4f} | "
        f"{result.mean_abs_diff:.4f} | {result.max_abs_diff:.4f} | "
        f"{result.between_steps_sd:.4f} | {result.correlation:.4f} |",
        "",
        "MUR's decisions (steps 2 on) replayed on each trace, recorded m_t against this server's:",
        "",
        "| setting | decisions | differ | scaled, recorded % | scaled, this server % |",
        "|---|---|---|---|---|",
    ]
    for label, (differ, decided, before, after) in result.flips.items():
        lines.append(
            f"| {label} | {decided} | {differ} ({100 * differ / max(decided, 1):.1f}%) | "
            f"{100 * before:.1f} | {100 * after:.1f} |"
        )
    return "\n".join(lines) + "\n"
