"""Step formats (marker as the paper, paragraph for models that write no markers) and the
answer-phrase rule that ends a solution."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from fakes import FakeLogprobChat, Scripted
from mur.graphs.mur import build_graph
from mur.graphs.solve import solve
from mur.graphs.state import Context
from mur.nodes.answer import extract_answer, states_answer
from mur.nodes.draft import STEP_FORMATS, contains_answer, step_messages
from mur.prompts.mur import PARAGRAPH_INSTRUCTION, STEP_INSTRUCTION

MARKER, PARAGRAPH = STEP_FORMATS["marker"], STEP_FORMATS["paragraph"]


def test_marker_format_is_the_papers() -> None:
    assert MARKER.prefix([], 1) == "Step1:"
    assert MARKER.prefix(["a", "b"], 3) == "Step1: a\nStep2: b\nStep3:"
    assert MARKER.stops(2) == ["\nStep", "Step3:"]
    assert MARKER.rollout_stops(2, 1) == ["\nStep4:", "Step4:"]
    assert MARKER.rollout_stops(2, 0) is None
    assert MARKER.instruction == STEP_INSTRUCTION


def test_paragraph_format_ends_a_step_at_a_blank_line() -> None:
    assert PARAGRAPH.prefix([], 1) == ""
    assert PARAGRAPH.prefix(["First.", "Second."], 3) == "First.\n\nSecond.\n\n"
    assert PARAGRAPH.solution(["First.", "Second."]) == "First.\n\nSecond."
    assert PARAGRAPH.stops(5) == ["\n\n"]
    assert PARAGRAPH.rollout_stops(2, 1) == ["\n\n"]
    assert PARAGRAPH.rollout_stops(2, 3) is None  # the token cap ends a longer rollout
    messages = step_messages("Q?", None, ["First."], 2, PARAGRAPH)
    assert messages[0].content == f"Q?\n{PARAGRAPH_INSTRUCTION}"
    assert messages[-1].content == "First.\n\n"


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("So the answer is 42.", "42"),
        ("The answer is: The answer is 48", "48"),
        ("Thus the final answer is $\\boxed{72}$.", "72"),
        # An echo of the instruction states nothing.
        ("Always end your solution with the phrase 'the answer is' followed by it.", None),
        ('I will finish with "The answer is" and the number.', None),
        ("so the answer is", None),  # cut before the answer: the next step gives it
    ],
)
def test_answer_phrase_rule(text: str, answer: str | None) -> None:
    assert states_answer(text) is (answer is not None)
    assert contains_answer(text) is (answer is not None)
    assert extract_answer(text) == answer


def test_an_echo_before_a_real_answer_still_finds_the_answer() -> None:
    text = "I must end with the phrase 'the answer is'. 6 * 7 = 42, so the answer is 42."
    assert extract_answer(text) == "42" and states_answer(text)


def paragraph_responder(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
    """Three paragraphs; the third states the answer and ends the sequence."""
    last = messages[-1]
    assert isinstance(messages[-2] if isinstance(last, AIMessage) else last, HumanMessage)
    assert kwargs["stop"] == ["\n\n"]
    done = str(last.content).count("\n\n") if isinstance(last, AIMessage) else 0
    if done == 2:
        return Scripted("6 * 7 = 42, so the answer is 42.", [-0.1] * 5, stop_reason=None)
    return Scripted(f"Paragraph {done + 1}.", [-0.2] * 3, stop_reason="\n\n")


async def test_the_graph_runs_in_paragraph_format() -> None:
    model = FakeLogprobChat(responder=paragraph_responder)
    context = Context(gate="never", step_format="paragraph")
    solution = await solve(build_graph(backbone=model), "6 * 7?", context=context)
    result = solution.output
    assert [s["text"] for s in result["steps"]] == [
        "Paragraph 1.",
        "Paragraph 2.",
        "6 * 7 = 42, so the answer is 42.",
    ]
    assert result["answer"] == "42" and result["finish_reason"] == "answer"
    assert result["config"]["step_format"] == "paragraph"
    # Step 3 continued the two kept paragraphs, separated as the model wrote them.
    assert model.calls[2]["messages"][-1].content == "Paragraph 1.\n\nParagraph 2.\n\n"


def test_unknown_step_format_is_refused() -> None:
    with pytest.raises(ValueError, match="step_format"):
        Context(step_format="lines")  # type: ignore[arg-type]
