"""The external model as a verifier (best-of-N) and as a critic: prompt, verdict, P(Yes)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage

from nodes.draft import NON_THINKING, solution_text
from nodes.llm import Generation, Reply, Request, generate
from prompts.mur import VERIFIER_PROMPT

VERDICT_PATTERN = re.compile(r"\\boxed\{\s*(yes|no)\s*\}", re.IGNORECASE)
# Alternatives the verifier may put in the judgement token; 5 is plenty for a Yes/No choice.
JUDGE_TOP_LOGPROBS = 5


class Judgement(TypedDict):
    """What the external model said of one step."""

    text: str
    verdict: bool | None
    p_yes: float
    analysis: str
    num_tokens: int


def judge_prompt(question: str, kept_texts: Sequence[str], index: int, paragraph: str) -> str:
    return VERIFIER_PROMPT.format(
        problem=question,
        solution=solution_text(kept_texts),
        index=index,
        paragraph=paragraph,
    )


def parse_verdict(text: str) -> bool | None:
    """The last boxed Yes/No of a judgement; None when it gave none."""
    found = VERDICT_PATTERN.findall(text)
    return found[-1].lower() == "yes" if found else None


def analysis_of(text: str) -> str:
    """The judgement without its verdict: what the critic feeds back to the backbone."""
    return VERDICT_PATTERN.sub("", text).strip()


def _word(token: str) -> str:
    return token.strip().lstrip("{").strip().lower()


def verdict_token_index(tokens: Sequence[str]) -> int | None:
    """The position of the Yes/No token: the first word token after the last `boxed{`, else
    the last token that is itself Yes or No."""
    offsets, text = [], ""
    for token in tokens:
        offsets.append(len(text))
        text += token
    opening = text.rfind("boxed{")
    if opening >= 0:
        start = opening + len("boxed{")
        for i, token in enumerate(tokens):
            if offsets[i] + len(token) > start and _word(token):
                return i if _word(token).startswith(("yes", "no")) else None
        return None
    for i in range(len(tokens) - 1, -1, -1):
        if _word(tokens[i]) in ("yes", "no"):
            return i
    return None


def p_yes(choice: Generation) -> float:
    """P("Yes") of the judgement token, summed over its spellings ("Yes", " Yes", "yes").

    When the sampled token is "No" the probability of "Yes" comes from the top logprobs. A
    judgement without a verdict scores 0.
    """
    index = verdict_token_index(choice.tokens)
    if index is None:
        return 0.0
    alternatives = {top.token: top.logprob for top in choice.top_logprobs[index]}
    alternatives[choice.tokens[index]] = choice.logprobs[index]
    probability = math.fsum(
        math.exp(logprob) for token, logprob in alternatives.items() if _word(token) == "yes"
    )
    return min(probability, 1.0)


async def judge_step(
    verifier: BaseChatModel,
    *,
    question: str,
    kept_texts: Sequence[str],
    index: int,
    paragraph: str,
    max_tokens: int,
) -> tuple[Judgement, Reply]:
    """Ask the external model whether step `index` (`paragraph`) is correct in context."""
    reply = await generate(
        verifier,
        Request(
            messages=[HumanMessage(judge_prompt(question, kept_texts, index, paragraph))],
            max_tokens=max_tokens,
            continue_final_message=False,
            top_logprobs=JUDGE_TOP_LOGPROBS,
            extra_body=NON_THINKING,
            role="external",
        ),
    )
    choice = reply.choices[0]
    judgement = Judgement(
        text=choice.text,
        verdict=parse_verdict(choice.text),
        p_yes=p_yes(choice),
        analysis=analysis_of(choice.text),
        num_tokens=choice.num_tokens,
    )
    return judgement, reply
