"""The graph for LangGraph Studio / `langgraph dev` (see langgraph.json).

One compiled graph with every refine strategy of the registry mounted as a subgraph: a run
picks its strategy, like its gate, in the context. On the default endpoints (env MUR_BASE_URL /
MUR_MODEL / MUR_VERIFIER_URL / MUR_VERIFIER_MODEL, else the embedded CPU server). No
checkpointer is compiled in: the LangGraph API server brings its own.
"""

from mur.graphs.mur import build_graph

mur = build_graph()
