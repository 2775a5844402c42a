"""Final-answer extraction, shared by the graph (done? / finalize) and the evaluator.

One implementation on purpose: the graph decides that a solution is finished with the same rule
that the grader uses to read its answer, so the two can never disagree about what was answered.
Pure string work, linear in the text length, never raises on any ``str``.
"""

from __future__ import annotations

import re

__all__ = ["extract_answer", "states_answer"]

# "the answer is" as the prompt asks for; "the final answer is" too, which models often write.
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is", re.IGNORECASE)
# A quoted phrase ("the phrase 'the answer is' followed by ...") echoes the instruction.
_QUOTES = frozenset("'\"`\u2018\u2019\u201c\u201d")
_BOXED = re.compile(r"\\boxed\s*\{")
# Math delimiters that may open the answer right after "the answer is", with their closers.
_OPENERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
# Leading filler between "the answer is" and the answer itself.
_LEAD = " \t\r\n:*"
_TRAIL = " \t\r\n.;,*"
# Layers of wrapping ($, \boxed{}, ...) peeled off one answer; real answers have one or two.
_MAX_UNWRAP = 8
# A sentence ending after a plain answer ("... is 42. Let me check."); decimals have no space.
_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])")


def extract_answer(text: str) -> str | None:
    """Return the model's final answer in ``text``, or None when it gave none.

    Rule (the MUR contract): the text after the LAST case-insensitive "the answer is" that is
    not a quoted echo of the instruction (a
    ``\\boxed{...}`` there is unwrapped; ``$...$`` and a trailing period are stripped; without
    a box or math delimiters it runs to the end of that line or sentence); otherwise the
    content of the last complete ``\\boxed{...}`` (balanced braces); otherwise None.
    """
    if not isinstance(text, str) or not text:
        return None
    answer = _stated_answer(text)
    if answer:
        return answer
    boxes = _boxed_contents(text)
    if boxes:
        answer = _clean(boxes[-1])
        return answer or None
    return None


def states_answer(text: str) -> bool:
    """True when `text` states an answer with the phrase ("the answer is 72"): the rule that
    ends a solution. An echo of the instruction (the phrase in quotes) or the phrase with
    nothing after it does not count."""
    return isinstance(text, str) and _stated_answer(text) is not None


def _stated_answer(text: str) -> str | None:
    """The answer after the last "the answer is" that is not a quoted echo, else None."""
    for match in reversed(list(_ANSWER_IS.finditer(text))):
        before = text[max(match.start() - 1, 0) : match.start()]
        if before in _QUOTES or text[match.end() : match.end() + 1] in _QUOTES:
            continue
        return _answer_after(text[match.end() :])
    return None


def _answer_after(tail: str) -> str | None:
    """The answer written after an "the answer is" (``tail`` starts right after "is")."""
    boxes = _boxed_contents(tail)
    if boxes:
        return _clean(boxes[0]) or None
    body = tail.lstrip(_LEAD)
    for opener, closer in _OPENERS:
        if body.startswith(opener):
            end = body.find(closer, len(opener))
            if end != -1:
                return _clean(body[len(opener) : end]) or None
            break
    line = body.split("\n", 1)[0]
    line = _SENTENCE_END.split(line, maxsplit=1)[0]
    return _clean(line) or None


def _clean(answer: str) -> str:
    """Strip whitespace, a trailing period, bold markers, outer math delimiters and boxes."""
    answer = _trim(answer)
    for _ in range(_MAX_UNWRAP):  # bounded: each round copies the answer
        inner = _unwrap_once(answer)
        if inner is None:
            break
        answer = _trim(inner)
    return answer


def _trim(answer: str) -> str:
    return answer.strip().rstrip(_TRAIL).lstrip(_LEAD)


def _unwrap_once(answer: str) -> str | None:
    """The inside of one delimiter pair or box that wraps the whole answer, else None."""
    box = _BOXED.match(answer)
    if box and _matching_braces(answer).get(box.end() - 1) == len(answer) - 1:
        return answer[box.end() : -1]
    for opener, closer in _OPENERS:
        if (
            len(answer) >= len(opener) + len(closer)
            and answer.startswith(opener)
            and answer.endswith(closer)
        ):
            inner = answer[len(opener) : len(answer) - len(closer)]
            # "$a$ and $b$" starts and ends with "$" but is not one wrapped answer.
            return None if closer in inner else inner
    return None


def _boxed_contents(text: str) -> list[str]:
    """Contents of the top-level, closed ``\\boxed{...}`` groups of ``text``, in order.

    Braces are matched in one pass (escaped ``\\{`` and ``\\}`` do not count), so a box left
    open by a truncated generation is skipped and nested boxes stay inside their outer box.
    """
    if "\\boxed" not in text:
        return []
    closing = _matching_braces(text)
    contents: list[str] = []
    covered_until = 0
    for match in _BOXED.finditer(text):
        if match.start() < covered_until:
            continue  # nested in a box already taken
        open_at = match.end() - 1
        close_at = closing.get(open_at)
        if close_at is None:
            continue  # never closed: a truncated answer
        contents.append(text[open_at + 1 : close_at])
        covered_until = close_at + 1
    return contents


def _matching_braces(text: str) -> dict[int, int]:
    """Map the index of every closed ``{`` to the index of its ``}``."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            i += 2  # an escaped character (\{, \}, \\) never opens or closes a group
            continue
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    return closing
