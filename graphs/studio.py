"""Graphs for LangGraph Studio / `langgraph dev` (see langgraph.json).

One compiled graph per refine strategy, on the default endpoints (env MUR_BASE_URL /
MUR_MODEL / MUR_VERIFIER_URL / MUR_VERIFIER_MODEL, else the embedded CPU server). No
checkpointer is compiled in: the LangGraph API server brings its own.
"""

from graphs.mur import build_graph

critic = build_graph("critic")
best_of_n = build_graph("best_of_n")
foresight = build_graph("foresight")
thinking = build_graph("thinking")
