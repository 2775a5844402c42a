"""The external model as a verifier (best-of-N) and as a critic: prompt, verdict, P(Yes).

The paper's verifier, GenPRM-1.5B, answers in its own trained format: an analysis, often a
code check, then the verdict in an output section, and nothing after it:

    <analyze>
    Let's analyze the Paragraph 2 step by step: ...
    </analyze>
    <verify>
    Let's use python code to find any potential error:
    ```python
    ...
    ```
    [Code Output]
    ...
    </verify>
    <output>
    **Judgement**: $\\boxed{Yes}$
    </output>

Its own inference code stops at `</output>`; so does the judge request here. The analysis may
hold boxed math and the words Yes/No: the verdict is the last boxed Yes/No only, and a reply
without one (cut by the token cap) has no verdict. A bare Yes/No counts only as the reply's
last word (a verifier that answers in one word).

A judgement without a verdict can be given one (`force_verdict`): the verdict line is appended
and the verifier continues it for a few tokens, so the critic revises only on a No and best-of-N
scores every candidate by a real P(Yes). Off by default: the paper's rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from mur.nodes.draft import NON_THINKING, solution_text
from mur.nodes.llm import Generation, Reply, Request, generate
from mur.nodes.usage import Usage
from mur.prompts.mur import FORCED_VERDICT, VERIFIER_PROMPT

# \boxed{Yes}, also written \boxed{\text{Yes}}; group 1 is the verdict word.
_VERDICT = r"\\boxed\{\s*(?:\\text\{\s*)?(yes|no)\s*\}(?:\s*\})?"
VERDICT_PATTERN = re.compile(_VERDICT, re.IGNORECASE)
# The end of GenPRM's output section: nothing after it belongs to this judgement.
JUDGEMENT_END = "</output>"
_OUTPUT_SECTION = re.compile(r"<output>.*?(?:</output>|$)", re.IGNORECASE | re.DOTALL)
_BOXED_VERDICT = re.compile(rf"\$?{_VERDICT}\$?", re.IGNORECASE)
_VERDICT_WORD = re.compile(r"(yes|no)\b")
# The reply's last word and whatever punctuation follows it ("Yes.", "The step is fine: No").
_LAST_WORD = re.compile(r"([A-Za-z]+)[^A-Za-z0-9]*$")
_SECTION_TAG = re.compile(r"</?(?:analyze|verify)>", re.IGNORECASE)
_VERDICT_LABEL = re.compile(r"\**judge?ment\**\s*:?\s*$", re.IGNORECASE)
_SPECIAL_TOKEN = re.compile(r"^<[|｜].*[|｜]>$")
# Alternatives the verifier may put in the judgement token; 5 is plenty for a Yes/No choice.
JUDGE_TOP_LOGPROBS = 5
# Enough for the forced verdict to close: "Yes}$", or "\\text{Yes}}$".
FORCED_VERDICT_MAX_TOKENS = 8


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
    """The last boxed Yes/No of a judgement; else its last word when that is Yes or No (a
    critic that answers in one word: the same rule `verdict_token_index` scores); None when
    it gave neither (e.g. an analysis cut by the token cap)."""
    found = VERDICT_PATTERN.findall(text)
    if found:
        return bool(found[-1].lower() == "yes")
    last = _LAST_WORD.search(text)
    if last and last.group(1).lower() in ("yes", "no"):
        return last.group(1).lower() == "yes"
    return None


def analysis_of(text: str) -> str:
    """The judgement without its verdict: what the critic feeds back to the backbone (for
    GenPRM: its analysis and code check, without the section tags and the output section)."""
    text = _BOXED_VERDICT.sub("", _OUTPUT_SECTION.sub("", text))
    text = _VERDICT_LABEL.sub("", _SECTION_TAG.sub("", text).strip())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _word(token: str) -> str:
    return token.strip().lstrip("{").strip().lower()


def _is_word(token: str) -> bool:
    """A token with letters or digits that is not a special token such as <|im_end|>."""
    stripped = token.strip()
    return any(c.isalnum() for c in stripped) and not _SPECIAL_TOKEN.match(stripped)


def verdict_token_index(tokens: Sequence[str], prefix: str = "") -> int | None:
    """The position of the Yes/No token: in the last complete boxed Yes/No (the verdict
    `parse_verdict` reads); else the first word after a last `boxed{` cut short; else the
    reply's last word when it is Yes or No. None when there is no verdict. `prefix` is text
    the tokens continue (a forced verdict line), read with them but not one of them."""
    offsets, text = [], prefix
    for token in tokens:
        offsets.append(len(text))
        text += token
    verdicts = list(VERDICT_PATTERN.finditer(text))
    opening = text.rfind("boxed{")
    if verdicts:
        start = verdicts[-1].start(1)
    elif opening >= 0 and not text[opening:].count("}"):
        start = opening + len("boxed{")
    else:
        for i in range(len(tokens) - 1, -1, -1):
            if _is_word(tokens[i]):
                return i if _word(tokens[i]) in ("yes", "no") else None
        return None
    for i, token in enumerate(tokens):
        if offsets[i] + len(token) > start and _is_word(token):
            return i if _VERDICT_WORD.match(_word(token)) else None
    return None


def p_yes(choice: Generation, prefix: str = "") -> float:
    """P("Yes") of the judgement token, summed over its spellings ("Yes", " Yes", "yes").

    When the sampled token is "No" the probability of "Yes" comes from the top logprobs. A
    judgement without a verdict scores 0. `prefix`: as in `verdict_token_index`.
    """
    index = verdict_token_index(choice.tokens, prefix)
    if index is None:
        return 0.0
    alternatives = choice.alternatives(index)
    alternatives[choice.tokens[index]] = choice.logprobs[index]
    probability = math.fsum(
        math.exp(logprob) for token, logprob in alternatives.items() if _word(token) == "yes"
    )
    return min(probability, 1.0)


def _judge_request(messages: Sequence[BaseMessage], max_tokens: int, *, continues: bool) -> Request:
    """A judge request; `continues`: the last message is a judgement so far, to continue."""
    return Request(
        messages=messages,
        max_tokens=max_tokens,
        stop=[JUDGEMENT_END],
        continue_final_message=continues,
        top_logprobs=JUDGE_TOP_LOGPROBS,
        extra_body=NON_THINKING,
        role="external",
    )


async def continue_to_verdict(verifier: BaseChatModel, prompt: HumanMessage, text: str) -> Reply:
    """The verdict of a judgement `text` that gave none: the verifier continues it from the
    verdict line (`FORCED_VERDICT`) for a few tokens; read them with `forced_verdict`."""
    messages = [prompt, AIMessage(text + FORCED_VERDICT)]
    return await generate(
        verifier, _judge_request(messages, FORCED_VERDICT_MAX_TOKENS, continues=True)
    )


def forced_verdict(choice: Generation) -> tuple[bool | None, float]:
    """The verdict and P(Yes) of a continuation from the verdict line (`continue_to_verdict`)."""
    return parse_verdict(FORCED_VERDICT + choice.text), p_yes(choice, FORCED_VERDICT)


async def judge_step(
    verifier: BaseChatModel,
    *,
    question: str,
    kept_texts: Sequence[str],
    index: int,
    paragraph: str,
    max_tokens: int,
    force_verdict: bool = False,
) -> tuple[Judgement, Usage]:
    """Ask the external model whether step `index` (`paragraph`) is correct in context; with
    `force_verdict`, a reply without a verdict is continued from the verdict line."""
    prompt = HumanMessage(judge_prompt(question, kept_texts, index, paragraph))
    reply = await generate(verifier, _judge_request([prompt], max_tokens, continues=False))
    choice, usage = reply.choices[0], reply.usage("external")
    text, num_tokens = choice.text, choice.num_tokens
    verdict, probability = parse_verdict(text), p_yes(choice)
    if force_verdict and verdict is None:
        forced = await continue_to_verdict(verifier, prompt, choice.text)
        continuation = forced.choices[0]
        verdict, probability = forced_verdict(continuation)
        text += FORCED_VERDICT + continuation.text
        num_tokens += continuation.num_tokens
        usage += forced.usage("external")
    judgement = Judgement(
        text=text,
        verdict=verdict,
        p_yes=probability,
        analysis=analysis_of(text),
        num_tokens=num_tokens,
    )
    return judgement, usage
