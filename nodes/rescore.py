"""The backbone's uncertainty of a step it did not write: the step placed where the backbone
would have written it (its assistant message continued with the step's text) and read back
with vLLM's prompt logprobs, in one request that generates a single token.

A cascade keeps a step the external model wrote; what the momentum then reads can be the
backbone's own surprise at that text, on the same scale as the steps it wrote itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.language_models import BaseChatModel

from mur.nodes.draft import NON_THINKING, StepFormat, step_messages
from mur.nodes.llm import MissingLogprobsError, Reply, Request, generate

PROMPT_LOGPROBS = {"prompt_logprobs": 0}
"""vLLM's request field for the logprob of each prompt token (0: the prompt's own token only)."""


async def score_step(
    backbone: BaseChatModel,
    *,
    question: str,
    system_prompt: str | None,
    kept_texts: Sequence[str],
    index: int,
    text: str,
    fmt: StepFormat,
) -> tuple[list[float], Reply]:
    """The backbone's logprob of each token of `text` as step `index` after the kept steps,
    and the reply (one generated token, counted as the backbone's)."""
    messages = step_messages(question, system_prompt, kept_texts, index, fmt, partial=text)
    request = Request(messages, max_tokens=1, extra_body={**NON_THINKING, **PROMPT_LOGPROBS})
    reply = await generate(backbone, request)
    pairs = reply.choices[0].prompt_logprobs
    if not pairs:
        raise MissingLogprobsError(
            "the backbone's reply carries no prompt_logprobs, so the step the external model "
            "wrote cannot be scored by the backbone: serve it with vLLM (which returns them "
            "when asked), or run with escalate_momentum draft"
        )
    return text_logprobs(pairs, text), reply


def text_logprobs(pairs: Sequence[tuple[str, float]], text: str) -> list[float]:
    """The logprobs of the prompt's last tokens that spell `text`: tokens are taken from the
    end until their decoded text is at least as long as `text` (a first token that carries
    the space before it counts, as it does in a step the backbone writes itself)."""
    wanted = len(text.strip())
    if wanted == 0:
        raise ValueError("an empty step has no tokens to score")
    spelled = 0
    logprobs: list[float] = []
    for token, logprob in reversed(pairs):
        logprobs.append(logprob)
        spelled += len(token)
        if spelled >= wanted:
            return logprobs[::-1]
    raise ValueError(
        f"the prompt's {len(pairs)} scored tokens spell {spelled} characters, fewer than the "
        f"step's {wanted}: the server did not score the whole prompt"
    )
