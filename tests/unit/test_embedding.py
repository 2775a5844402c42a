"""The README's embedding example: the MUR graph as a node of a parent graph."""

from __future__ import annotations

from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from fakes import FakeLogprobChat, Scripted
from mur import Context, build_graph


class TutorState(TypedDict):
    problem: str
    answer: str | None
    scaled_steps: int
    feedback: str


def build_tutor(backbone):
    mur = build_graph(backbone=backbone)

    async def solve(state: TutorState) -> dict:
        result = await mur.ainvoke({"question": state["problem"]}, context=Context(gamma=0.8))
        return {
            "answer": result["answer"],
            "scaled_steps": sum(step["scaled"] for step in result["steps"]),
        }

    def give_feedback(state: TutorState) -> dict:
        return {"feedback": f"The answer is {state['answer']}."}

    tutor = StateGraph(TutorState)
    tutor.add_node("solve", solve)
    tutor.add_node("give_feedback", give_feedback)
    tutor.add_edge(START, "solve")
    tutor.add_edge("solve", "give_feedback")
    tutor.add_edge("give_feedback", END)
    return tutor.compile()


async def test_mur_graph_embeds_in_a_parent_graph_with_its_own_state() -> None:
    def respond(messages, kwargs):
        if "Step2:" in str(messages[-1].content):
            return Scripted(" So the answer is 7.", [-0.2] * 5, stop_reason=None)
        return Scripted(" 3 + 4 = 7", [-0.4] * 4)

    tutor = build_tutor(FakeLogprobChat(responder=respond))
    state = await tutor.ainvoke({"problem": "What is 3 + 4?"})
    assert state["answer"] == "7"
    assert state["feedback"] == "The answer is 7."
    assert state["scaled_steps"] == 0
